//! Load on an ahead-of-time compiled model: the shared library `smelt compile --shared`
//! writes, called through its C interface from 64 threads at once, each call on inputs of
//! its own with its own scratch, returns exactly what serial calls return, and the
//! process's resident memory stays flat once warm.
//!
//! `SMELT_LOAD_SECONDS` sets how long the soak runs (default 4). One test in this file: it
//! reads the whole process's memory.

mod common;

use common::cli::have_cc;
use common::load::{seconds, soak};
use common::{Tol, assert_close, inputs_for, temp_dir};
use smelt::cli::compile::{CompileArgs, Target, run};
use smelt::ir::parse_module;
use smelt::{DType, Tensor};
use std::ffi::c_void;

const SETS: u64 = 12;

/// A transformer-style block: products, GELU, layer norm, softmax and a reduction.
const BLOCK: &str = "graph block(%x: f32[32,128], %w1: f32[256,128], %b1: f32[256], %w2: f32[128,256], %g: f32[128], %b: f32[128]) {
  %h = linear(%x, %w1, %b1)
  %a = gelu(%h)
  %y = linear(%a, %w2)
  %n = layer_norm(%y, %g, %b, normalized_shape=[128], eps=1e-5)
  %s = softmax(%n, dim=-1)
  %t = sum(%s, dim=[0])
  return %s, %t
}";

/// `NAME_run(inputs, outputs, scratch, bytes)`.
type RunFn =
    unsafe extern "C" fn(*const *const c_void, *const *mut c_void, *mut c_void, usize) -> i32;

/// One call with fresh outputs and the caller's scratch: the outputs' bytes.
fn call(run: RunFn, ins: &[Vec<u8>], out_bytes: &[usize], scratch: &mut [u64]) -> Vec<Vec<u8>> {
    let mut outs: Vec<Vec<u8>> = out_bytes.iter().map(|&n| vec![0u8; n]).collect();
    let in_ptrs: Vec<*const c_void> = ins.iter().map(|b| b.as_ptr().cast()).collect();
    let out_ptrs: Vec<*mut c_void> = outs.iter_mut().map(|b| b.as_mut_ptr().cast()).collect();
    // SAFETY: every input holds its declared bytes, every output its declared size, and the
    // scratch (8-byte aligned, as the header asks) its declared size; the model reads and
    // writes nothing else.
    let rc = unsafe {
        run(
            in_ptrs.as_ptr(),
            out_ptrs.as_ptr(),
            scratch.as_mut_ptr().cast(),
            scratch.len() * 8,
        )
    };
    assert_eq!(rc, 0, "the model's run returned {rc}");
    outs
}

#[test]
fn sixty_four_threads_on_one_shared_library_get_the_serial_results() {
    if !have_cc("sixty_four_threads_on_one_shared_library_get_the_serial_results") {
        return;
    }
    let dir = temp_dir("aot-load");
    let model = dir.join("block.smelt");
    std::fs::write(&model, BLOCK).unwrap();
    let args = CompileArgs {
        model,
        target: Target::Cpu,
        out: dir.to_path_buf(),
        arch: "sm_90".into(),
        graph: None,
        fast_math: false,
        name: Some("block".into()),
        cpu: "native".into(),
        weights: None,
        shared: true,
        target_triple: None,
    };
    run(&args).unwrap();
    let header = std::fs::read_to_string(dir.join("block.h")).unwrap();
    let scratch_bytes: usize = header
        .lines()
        .find_map(|l| l.strip_prefix("#define BLOCK_SCRATCH_BYTES "))
        .unwrap()
        .trim()
        .parse()
        .unwrap();
    // SAFETY: the library is the model just compiled; loading it runs no code of its own.
    let lib = unsafe { libloading::Library::new(dir.join("libblock.so")) }.unwrap();
    // SAFETY: `block_run` has the C interface's signature (docs/aot.md).
    let run_fn: RunFn = *unsafe { lib.get::<RunFn>(b"block_run\0") }.unwrap();

    let g = parse_module(BLOCK, "block.smelt").unwrap().graphs.remove(0);
    let out_bytes: Vec<usize> = g
        .outputs()
        .iter()
        .map(|&v| g.node(v).ty.numel() * 4)
        .collect();
    let sets: Vec<Vec<Tensor>> = (0..SETS).map(|s| inputs_for(&g, 2000 + s)).collect();
    let raw: Vec<Vec<Vec<u8>>> = sets
        .iter()
        .map(|ins| ins.iter().map(|t| t.to_bytes().unwrap()).collect())
        .collect();
    let words = scratch_bytes.div_ceil(8).max(1);
    let mut scratch = vec![0u64; words];
    let want: Vec<Vec<Vec<u8>>> = raw
        .iter()
        .map(|ins| call(run_fn, ins, &out_bytes, &mut scratch))
        .collect();
    // the serial results are the interpreter's (within rounding)
    let interp = smelt::jit::run_graph(&g, &sets[0]).unwrap();
    for (k, (bytes, w)) in want[0].iter().zip(&interp).enumerate() {
        let got = Tensor::from_bytes(DType::F32, w.shape(), bytes).unwrap();
        assert_close(
            &got,
            w,
            Tol::rel(1e-4),
            &format!("output {k} against the interpreter"),
        );
    }

    soak(seconds(4.0), |t, i| {
        let k = i % raw.len();
        let mut scratch = vec![0u64; words];
        if call(run_fn, &raw[k], &out_bytes, &mut scratch) != want[k] {
            return Err(format!(
                "thread {t}: input set {k} differs from its serial result"
            ));
        }
        Ok(())
    });
}
