//! Load: compiled functions called from 64 threads at once, each call on inputs of its own,
//! return exactly what serial calls return, and the process's resident memory stays flat
//! once warm; eager ops and tracing run on other threads at the same time.
//!
//! `SMELT_LOAD_SECONDS` sets how long the soak runs (default 8). The long run of
//! docs/fuzzing.md is `SMELT_LOAD_SECONDS=600 cargo test --release --test load -- --nocapture`.
//! One test in this file: it reads the whole process's memory.

mod common;

use common::load::{seconds, soak};
use common::{Tol, assert_close, inputs_for};
use smelt::Tensor;
use smelt::exec::{CompileOptions, CompiledFn};
use smelt::ir::parse_module;
use smelt::jit::trace;

/// Distinct input sets, each with its serial result.
const SETS: u64 = 12;

/// A transformer-style block whose kernels are large enough to split across the pool's
/// threads, so that outer callers and inner chunks compete.
const BLOCK: &str = "graph block(%x: f32[64,256], %w1: f32[512,256], %b1: f32[512], %w2: f32[256,512], %g: f32[256], %b: f32[256]) {
  %h = linear(%x, %w1, %b1)
  %a = gelu(%h)
  %y = linear(%a, %w2)
  %n = layer_norm(%y, %g, %b, normalized_shape=[256], eps=1e-5)
  %s = softmax(%n, dim=-1)
  %t = sum(%s, dim=[0])
  return %s, %t
}";

fn bits(ts: &[Tensor]) -> Vec<Vec<u8>> {
    ts.iter().map(|t| t.to_bytes().unwrap()).collect()
}

/// Eager ops and a trace compiled and called: work for the other threads while the
/// compiled functions are under load.
fn eager_and_traced(seed: u64) -> (Vec<f32>, Vec<f32>) {
    let x = Tensor::from_vec(
        (0..48)
            .map(|i| ((i as u64 * 7 + seed) % 13) as f32 / 13.0)
            .collect::<Vec<f32>>(),
        &[6, 8],
    )
    .unwrap();
    let eager = x
        .matmul(&x.t().unwrap())
        .unwrap()
        .softmax(-1)
        .unwrap()
        .to_vec::<f32>()
        .unwrap();
    let traced = trace(
        |xs: &[Tensor]| {
            let y = xs[0].matmul(&xs[0].t()?)?.softmax(-1)?;
            Ok(vec![y])
        },
        std::slice::from_ref(&x),
    )
    .unwrap()
    .compile(&CompileOptions::default())
    .unwrap()
    .call(std::slice::from_ref(&x))
    .unwrap()[0]
        .to_vec::<f32>()
        .unwrap();
    (eager, traced)
}

#[test]
fn sixty_four_threads_get_the_serial_results_and_memory_stays_flat() {
    let g = parse_module(BLOCK, "block.smelt").unwrap().graphs.remove(0);
    let f = CompiledFn::compile(&g, &CompileOptions::default()).unwrap();
    let sets: Vec<Vec<Tensor>> = (0..SETS).map(|s| inputs_for(&g, 1000 + s)).collect();
    let want: Vec<Vec<Vec<u8>>> = sets.iter().map(|ins| bits(&f.call(ins).unwrap())).collect();
    // serial results are the interpreter's too (within rounding), so "the same" means right
    let interp = smelt::jit::run_graph(&g, &sets[0]).unwrap();
    let got = f.call(&sets[0]).unwrap();
    assert_eq!(got.len(), interp.len());
    for (a, b) in got.iter().zip(&interp) {
        assert_close(a, b, Tol::rel(1e-4), "compiled against the interpreter");
    }
    let (eager_want, traced_want) = eager_and_traced(0);

    soak(seconds(8.0), |t, i| {
        let k = i % sets.len();
        if bits(&f.call(&sets[k]).unwrap()) != want[k] {
            return Err(format!("input set {k} differs from its serial result"));
        }
        // every eighth thread also runs eager ops and a fresh trace
        if t % 8 == 0 && i % 16 == t {
            let (e, tr) = eager_and_traced(0);
            if e != eager_want || tr != traced_want {
                return Err("eager ops or a trace differ under load".into());
            }
        }
        Ok(())
    });
}
