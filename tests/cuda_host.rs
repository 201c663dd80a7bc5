//! The generated CUDA C run without a GPU: every kernel is compiled as C++ against a small
//! host shim (`common/cuda_host.h`: blocks run one after another, each thread of a block is
//! an OS thread, `__syncthreads` is a barrier) and its results are checked against the
//! interpreter. This covers what NVRTC's compile test cannot: that the index arithmetic,
//! the vector accesses and their scalar tails, and the block reductions compute the right
//! values. Library calls (GEMMs, indexing ops) are left to the GPU tests.
//!
//! Needs a C++20 compiler (`$CXX`, else `c++`). Without one the tests print why and pass;
//! with `SMELT_REQUIRE_CXX=1` (CI) they fail instead.

mod common;

use common::cuda_cases::CASES;
use common::cuda_check::{assert_matches, graph_of, inputs};
use common::temp_dir;
use smelt::DType;
use smelt::codegen_cuda::indexing::INDEX_ERROR;
use smelt::codegen_cuda::{CudaOptions, CudaProgram, CudaStep, ParamAccess, generate};
use smelt::ir::graph::Graph;
use smelt::kernel::{BufferKind, Schedule, View};
use smelt::passes::Pipeline;
use smelt::runtime::interp;
use smelt::runtime::npy::{npy_to_bytes, read_npy_bytes};
use smelt::runtime::{Tensor, apply};
use std::process::Command;

const SHIM: &str = include_str!("common/cuda_host.h");

/// The C++ compiler, or `None` after printing why the test is skipped (a failure when the
/// environment requires one).
fn compiler_or_skip(test: &str) -> Option<String> {
    let cxx = std::env::var("CXX").unwrap_or_else(|_| "c++".into());
    let ok = Command::new(&cxx)
        .arg("--version")
        .output()
        .is_ok_and(|o| o.status.success());
    if ok {
        return Some(cxx);
    }
    if std::env::var("SMELT_REQUIRE_CXX").as_deref() == Ok("1") {
        panic!("{test}: SMELT_REQUIRE_CXX=1 but no C++ compiler runs as `{cxx}`");
    }
    eprintln!("{test}: skipped, no C++ compiler runs as `{cxx}`");
    None
}

/// One graph's program, ready to run once the host library is built.
struct Case {
    name: String,
    graph: Graph,
    schedule: Schedule,
    program: CudaProgram,
    /// Host symbol of each kernel's launcher.
    launchers: Vec<String>,
    /// Inputs to run it on (random ones when `None`).
    inputs: Option<Vec<Tensor>>,
    /// The error flag it must raise, if any.
    raises: Option<u32>,
}

/// The schedule of `g`, fused or one kernel per op.
fn schedule(g: &Graph, fuse: bool) -> Schedule {
    let mut p = Pipeline::default();
    p.options.fuse.fuse = fuse;
    if !fuse {
        p.graph_passes.retain(|x| x.name() != "rewrite");
    }
    let stage = p.run_until(g, "fuse").unwrap();
    stage.schedule.unwrap()
}

/// Collects cases into one translation unit; kernels get unique names per case.
#[derive(Default)]
struct Unit {
    cases: Vec<Case>,
    source: String,
    skipped: Vec<String>,
}

impl Unit {
    fn add(&mut self, name: &str, g: &Graph, fuse: bool) {
        let s = schedule(g, fuse);
        let program = generate(&s, &CudaOptions::default()).unwrap();
        let name = format!("{name} (fuse={fuse})");
        let library = program
            .steps
            .iter()
            .any(|st| matches!(st, CudaStep::Extern(_)));
        if library {
            self.skipped.push(name);
            return;
        }
        let id = self.cases.len();
        let mut launchers = Vec::new();
        for k in &program.kernels {
            let fname = format!("h{id}_{}", k.name);
            let src = k
                .source
                .replacen(&format!(" {}(", k.name), &format!(" {fname}("), 1);
            assert!(src != k.source, "{name}: kernel {} not renamed", k.name);
            self.source.push_str(&src);
            let args: Vec<String> = k
                .params
                .iter()
                .enumerate()
                .map(|(i, p)| format!("({})a[{i}]", p.ctype))
                .collect();
            let launcher = format!("sm_launch_{fname}");
            // threads that meet need threads of their own; the others run one by one
            let meet = ["__syncthreads", "__shfl", "__shared__", "sm_block_"]
                .iter()
                .any(|m| k.source.contains(m));
            let launch = if meet {
                "sm_host_launch"
            } else {
                "sm_host_launch_serial"
            };
            self.source.push_str(&format!(
                "extern \"C\" void {launcher}(void** a, unsigned int grid, unsigned int block) {{\n  {launch}(grid, block, [&] {{ {fname}({}); }});\n}}\n\n",
                args.join(", ")
            ));
            launchers.push(launcher);
        }
        self.cases.push(Case {
            name,
            graph: g.clone(),
            schedule: s,
            program,
            launchers,
            inputs: None,
            raises: None,
        });
    }

    /// Compiles the unit into a shared library in a fresh directory.
    fn build(&self, cxx: &str, test: &str) -> libloading::Library {
        let dir = temp_dir(test);
        let cpp = dir.join("kernels.cpp");
        let lib = dir.join("kernels.so");
        // the shim stands in for CUDA's half headers
        let prelude = CudaProgram::prelude(true)
            .replace("#include <cuda_fp16.h>\n", "")
            .replace("#include <cuda_bf16.h>\n", "");
        let text = format!("{SHIM}\n{prelude}\n{}", self.source);
        std::fs::write(&cpp, text).unwrap();
        let out = Command::new(cxx)
            .args(["-std=c++20", "-O1", "-shared", "-fPIC", "-pthread", "-w"])
            .args(["-fno-strict-aliasing", "-o"])
            .arg(&lib)
            .arg(&cpp)
            .output()
            .unwrap();
        assert!(
            out.status.success(),
            "{test}: the generated kernels do not compile as C++ ({}):\n{}",
            cpp.display(),
            String::from_utf8_lossy(&out.stderr)
        );
        // SAFETY: the library holds the kernels and launchers just compiled, nothing that runs
        // at load time beyond C++ static initialisation of the shim's globals.
        let l = unsafe { libloading::Library::new(&lib) }.unwrap();
        let _ = std::fs::remove_dir_all(&dir);
        l
    }
}

/// The data of a `.npy` file.
fn npy_data(npy: &[u8]) -> &[u8] {
    &npy[10 + u16::from_le_bytes([npy[8], npy[9]]) as usize..]
}

/// Raw little-endian bytes of a tensor's elements in row-major order (`.npy` has no bf16:
/// those are the high halves of their exact f32 values).
fn raw_bytes(t: &Tensor) -> Vec<u8> {
    if t.dtype() == DType::BF16 {
        let f = npy_to_bytes(&t.to_dtype(DType::F32).unwrap()).unwrap();
        return npy_data(&f).chunks(4).flat_map(|c| [c[2], c[3]]).collect();
    }
    npy_data(&npy_to_bytes(&t.contiguous().unwrap()).unwrap()).to_vec()
}

/// The elements of a buffer's bytes, as f64.
fn values(bytes: &[u8], dtype: DType) -> Vec<f64> {
    if dtype == DType::BF16 {
        let bits = bytes
            .chunks(2)
            .map(|c| u32::from(u16::from_le_bytes([c[0], c[1]])) << 16);
        return bits.map(|b| f64::from(f32::from_bits(b))).collect();
    }
    let n = bytes.len() / dtype.size();
    let mut npy = npy_to_bytes(&Tensor::zeros(&[n], dtype)).unwrap();
    let header = npy.len() - npy_data(&npy).len();
    npy.truncate(header);
    npy.extend_from_slice(bytes);
    read_npy_bytes(&npy, "buffer").unwrap().to_f64_vec()
}

/// A host buffer standing for a device allocation: 16-byte aligned, with its data starting
/// `shift` elements in (a misaligned pointer when `shift` is not a multiple of the vector).
struct HostBuf {
    mem: Vec<u128>,
    start: usize,
    bytes: usize,
}

impl HostBuf {
    fn new(data: &[u8], elem: usize, shift: usize) -> HostBuf {
        let start = shift * elem;
        let mut mem = vec![0u128; (start + data.len()).div_ceil(16) + 1];
        // SAFETY: `mem` holds at least `start + data.len()` bytes.
        unsafe {
            let p = (mem.as_mut_ptr() as *mut u8).add(start);
            std::ptr::copy_nonoverlapping(data.as_ptr(), p, data.len());
        }
        HostBuf {
            mem,
            start,
            bytes: data.len(),
        }
    }

    fn ptr(&mut self) -> *mut u8 {
        // SAFETY: `start` lies inside `mem`.
        unsafe { (self.mem.as_mut_ptr() as *mut u8).add(self.start) }
    }

    fn data(&self) -> &[u8] {
        // SAFETY: `mem` holds `start + bytes` initialised bytes.
        unsafe {
            std::slice::from_raw_parts((self.mem.as_ptr() as *const u8).add(self.start), self.bytes)
        }
    }
}

/// The elements of view `v` of a buffer, as a tensor.
fn gather(b: &HostBuf, s: &Schedule, v: &View) -> Tensor {
    let buf = &s.buffers[v.buffer];
    let flat = values(b.data(), buf.dtype);
    let n: usize = v.shape.iter().product();
    let mut vals = Vec::with_capacity(n);
    let mut pos = vec![0usize; v.shape.len()];
    for _ in 0..n {
        let at = v.offset
            + pos
                .iter()
                .zip(&v.strides)
                .map(|(p, s)| p * s)
                .sum::<usize>();
        vals.push(flat[at]);
        for d in (0..pos.len()).rev() {
            pos[d] += 1;
            if pos[d] < v.shape[d] {
                break;
            }
            pos[d] = 0;
        }
    }
    Tensor::from_vec(vals, &v.shape)
        .and_then(|t| t.to_dtype(buf.dtype))
        .unwrap()
}

type Launcher = unsafe extern "C" fn(*mut *mut u8, u32, u32);

/// Runs case `c` on `inputs` with every buffer `shift` elements past an aligned address;
/// the outputs, or `Err` when a kernel raised the error flag.
fn run(
    lib: &libloading::Library,
    c: &Case,
    inputs: &[Tensor],
    shift: usize,
) -> Result<Vec<Tensor>, String> {
    let s = &c.schedule;
    let mut bufs: Vec<HostBuf> = s
        .buffers
        .iter()
        .map(|b| {
            let data = match &b.kind {
                BufferKind::Input(i) => raw_bytes(&inputs[*i]),
                BufferKind::Constant(lit) => {
                    raw_bytes(&apply(smelt::ir::op::Op::Constant(lit.clone()), &[]).unwrap())
                }
                BufferKind::Temp => vec![0u8; b.len() * b.dtype.size()],
            };
            HostBuf::new(&data, b.dtype.size(), shift)
        })
        .collect();
    let mut flag = HostBuf::new(&[0u8; 4], 4, 0);
    for (i, k) in c.program.kernels.iter().enumerate() {
        if k.launch.grid() == 0 {
            continue;
        }
        let mut args: Vec<*mut u8> = k
            .params
            .iter()
            .map(|p| match (p.access, p.buffer) {
                (ParamAccess::ErrorFlag, _) => flag.ptr(),
                (_, Some(b)) => bufs[b].ptr(),
                (_, None) => panic!("{}: parameter {} without a buffer", c.name, p.name),
            })
            .collect();
        // SAFETY: the launcher was compiled from this kernel; its arguments are the kernel's
        // buffers in parameter order, each of its schedule size.
        unsafe {
            let f: libloading::Symbol<Launcher> = lib.get(c.launchers[i].as_bytes()).unwrap();
            f(args.as_mut_ptr(), k.launch.grid() as u32, k.launch.block());
        }
    }
    let flag = u32::from_le_bytes([
        flag.data()[0],
        flag.data()[1],
        flag.data()[2],
        flag.data()[3],
    ]);
    if flag != 0 {
        return Err(format!("error flag {flag}"));
    }
    Ok(s.outputs
        .iter()
        .map(|v| gather(&bufs[v.buffer], s, v))
        .collect())
}

/// Checks every case of `unit` against the interpreter, with aligned and shifted buffers.
fn check(unit: &Unit, lib: &libloading::Library) {
    for c in &unit.cases {
        let host = c.inputs.clone().unwrap_or_else(|| inputs(&c.graph));
        let named: Vec<(&str, Tensor)> = c
            .graph
            .inputs()
            .iter()
            .zip(&host)
            .map(|(&v, t)| (c.graph.node(v).name.as_str(), t.clone()))
            .collect();
        let want = interp::run(&c.graph, &named);
        for shift in [0, 1] {
            let what = format!("{} (buffers shifted by {shift})", c.name);
            match (&want, run(lib, c, &host, shift)) {
                (Ok(_), Ok(_)) if c.raises.is_some() => {
                    panic!("{what}: expected the error flag {:?}", c.raises)
                }
                (Ok(want), Ok(got)) => {
                    assert_eq!(got.len(), want.len(), "{what}: outputs");
                    for (i, (g, w)) in got.iter().zip(want).enumerate() {
                        assert_matches(&format!("{what} output {i}"), g, w);
                    }
                }
                (Err(_), Err(g)) => {
                    if let Some(f) = c.raises {
                        assert_eq!(g, format!("error flag {f}"), "{what}");
                    }
                }
                (w, g) => panic!("{what}: interpreter {w:?} vs host-run CUDA {g:?}"),
            }
        }
    }
}

/// Whether a case exercises the convolutional family (its own test, so that neither
/// host build takes a minute).
fn is_cnn_case(body: &str) -> bool {
    [
        "conv1d(",
        "conv2d(",
        "convolution_backward",
        "pool2d",
        "dropout(",
    ]
    .iter()
    .any(|op| body.contains(op))
}

/// Runs the cases `keep` selects, fused and unfused, against the interpreter.
fn run_cases(test: &str, min_programs: usize, keep: fn(&str) -> bool) {
    let Some(cxx) = compiler_or_skip(test) else {
        return;
    };
    smelt::manual_seed(11);
    let mut unit = Unit::default();
    for (name, params, body) in CASES.iter().filter(|(_, _, b)| keep(b)) {
        let g = graph_of(name, params, body);
        for fuse in [true, false] {
            unit.add(name, &g, fuse);
        }
    }
    // the library calls are the GPU tests' alone
    eprintln!(
        "{test}: {} programs run, {} left to the GPU",
        unit.cases.len(),
        unit.skipped.len()
    );
    assert!(
        unit.cases.len() >= min_programs,
        "{test}: too few programs run: {}",
        unit.cases.len()
    );
    let lib = unit.build(&cxx, test);
    check(&unit, &lib);
}

#[test]
fn every_op_computes_the_interpreters_values() {
    run_cases("every_op_computes_the_interpreters_values", 120, |b| {
        !is_cnn_case(b)
    });
}

#[test]
fn convolutional_ops_compute_the_interpreters_values() {
    run_cases(
        "convolutional_ops_compute_the_interpreters_values",
        100,
        is_cnn_case,
    );
}

#[test]
fn vector_accesses_and_tails_compute_the_interpreters_values() {
    let test = "vector_accesses_and_tails_compute_the_interpreters_values";
    let Some(cxx) = compiler_or_skip(test) else {
        return;
    };
    smelt::manual_seed(12);
    let chain = "%r = relu(%x)\n %h = mul(%r, 0.5)\n %y = add(%h, %b)";
    let cases: Vec<(String, String, String)> = [
        ("chain_4097", "%x: f32[4097], %b: f32[4097]", chain),
        // long strided rows, a thread each: 513 terms per sum, cancelling to small values
        (
            "sum_long_cols",
            "%x: f32[513,2049]",
            "%y = sum(%x, dim=[0])",
        ),
        ("chain_rows", "%x: f32[3,1030], %b: f32[1030]", chain),
        ("chain_tiny", "%x: f32[3], %b: f32[3]", chain),
        ("chain_one", "%x: f32[1], %b: f32[1]", chain),
        ("chain_empty", "%x: f32[0], %b: f32[0]", chain),
        ("chain_f64", "%x: f64[2,21], %b: f64[21]", chain),
        ("chain_i32", "%x: i32[6,11], %b: i32[11]", chain),
        ("chain_i64", "%x: i64[45], %b: i64[45]", chain),
        ("chain_f16", "%x: f16[3,37], %b: f16[37]", chain),
        ("chain_bf16", "%x: bf16[2,45], %b: bf16[45]", chain),
        (
            "sliced",
            "%x: f32[9,37], %b: f32[35]",
            "%s = narrow(%x, dim=1, start=1, length=35)\n %e = exp(%s)\n %y = sub(%e, %b)",
        ),
        (
            "transposed",
            "%x: f32[13,8], %b: f32[13]",
            "%t = t(%x)\n %y = mul(%t, %b)",
        ),
        (
            "compare_to_bool",
            "%x: f32[4,9], %b: f32[4,9]",
            "%y = gt(%x, %b)",
        ),
        (
            "where_bool",
            "%x: f32[33], %m: bool[33]",
            "%n = neg(%x)\n %y = where(%m, %x, %n)",
        ),
        ("cast_u8", "%x: u8[19]", "%y = to(%x, dtype=i16)"),
        ("cast_i8", "%x: i8[5,4]", "%y = to(%x, dtype=f32)"),
        ("softmax_rows", "%x: f32[5,37]", "%y = softmax(%x, dim=-1)"),
        (
            "layer_norm",
            "%x: f32[6,40], %w: f32[40], %b: f32[40]",
            "%y = layer_norm(%x, %w, %b, normalized_shape=[40])",
        ),
        ("sum_cols", "%x: f32[17,5]", "%y = sum(%x, dim=[0])"),
        // rows of a multiple of four elements read by vectors, with their tails per thread
        ("softmax_vec", "%x: f32[5,40]", "%y = softmax(%x, dim=-1)"),
        (
            "log_softmax_bf16",
            "%x: bf16[3,48]",
            "%y = log_softmax(%x, dim=1)",
        ),
        ("sum_rows_f64", "%x: f64[3,68]", "%y = sum(%x, dim=[1])"),
        ("argmax_rows", "%x: i32[4,36]", "%y = argmax(%x, dim=1)"),
        (
            "layer_norm_vec",
            "%x: f32[6,1028], %w: f32[1028], %b: f32[1028]",
            "%y = layer_norm(%x, %w, %b, normalized_shape=[1028])",
        ),
        (
            "softmax_narrowed",
            "%x: f32[9,40]",
            "%s = narrow(%x, dim=1, start=4, length=32)\n %y = softmax(%s, dim=-1)",
        ),
    ]
    .iter()
    .map(|(a, b, c)| (a.to_string(), b.to_string(), c.to_string()))
    .collect();
    let mut unit = Unit::default();
    for (name, params, body) in &cases {
        let g = graph_of(name, params, body);
        for fuse in [true, false] {
            unit.add(name, &g, fuse);
        }
    }
    assert!(
        unit.skipped.is_empty(),
        "{test}: skipped {:?}",
        unit.skipped
    );
    // the contiguous chains go through vector loads and stores (and so do their tails)
    let vector_rows = |n: &str| {
        let c = unit
            .cases
            .iter()
            .find(|c| c.name == format!("{n} (fuse=true)"))
            .unwrap();
        c.program.kernels.iter().any(|k| k.source.contains("sm_j4"))
    };
    let vector = |n: &str| {
        let c = unit
            .cases
            .iter()
            .find(|c| c.name == format!("{n} (fuse=true)"))
            .unwrap();
        // the vector loop's variable
        c.program.kernels.iter().any(|k| k.source.contains("sm_i4"))
    };
    for n in [
        "chain_4097",
        "chain_rows",
        "chain_f64",
        "chain_i32",
        "chain_i64",
    ] {
        assert!(vector(n), "{test}: {n} has no vector access");
    }
    for n in [
        "softmax_vec",
        "log_softmax_bf16",
        "sum_rows_f64",
        "argmax_rows",
        "layer_norm_vec",
        "softmax_narrowed",
    ] {
        assert!(
            vector_rows(n),
            "{test}: {n} reads its rows element by element"
        );
    }
    assert!(
        !vector_rows("softmax_rows"),
        "{test}: rows of 37 are not aligned"
    );
    for n in ["chain_tiny", "chain_one"] {
        assert!(!vector(n), "{test}: {n} is too short for a vector");
    }
    let lib = unit.build(&cxx, "vectors");
    check(&unit, &lib);
}

/// An i64 (or i32) index tensor of `shape` with values in `0..bound`.
fn index(shape: &[usize], bound: i64, dtype: DType) -> Tensor {
    Tensor::randint(0, bound, shape, Some(DType::I64))
        .and_then(|t| t.to_dtype(dtype))
        .unwrap()
}

#[test]
fn indexing_kernels_compute_the_interpreters_values() {
    let test = "indexing_kernels_compute_the_interpreters_values";
    let Some(cxx) = compiler_or_skip(test) else {
        return;
    };
    smelt::manual_seed(13);
    let f32s = |shape: &[usize]| Tensor::randn(shape, Some(DType::F32)).unwrap();
    // small whole numbers: their sums are exact in every dtype and order
    let ints = |shape: &[usize], d: DType| {
        index(shape, 9, DType::I64)
            .add_scalar(-4)
            .and_then(|t| t.to_dtype(d))
            .unwrap()
    };
    let of = |shape: &[usize], d: DType| {
        f32s(shape)
            .mul_scalar(4.0)
            .and_then(|t| t.to_dtype(d))
            .unwrap()
    };
    // (name, params, body, inputs, the error flag it raises)
    type IndexCase = (
        &'static str,
        &'static str,
        &'static str,
        Vec<Tensor>,
        Option<u32>,
    );
    let cases: Vec<IndexCase> = vec![
        (
            "index_select_view",
            "%x: f32[5,7], %i: i64[4]",
            "%t = t(%x)\n %y = index_select(%t, %i, dim=1)",
            vec![f32s(&[5, 7]), index(&[4], 5, DType::I64)],
            None,
        ),
        (
            "index_select_0d",
            "%x: i32[6,3], %i: i32[]",
            "%y = index_select(%x, %i, dim=0)",
            vec![of(&[6, 3], DType::I32), index(&[], 6, DType::I32)],
            None,
        ),
        (
            "gather_rows",
            "%x: f64[6,4], %i: i64[3,4]",
            "%y = gather(%x, %i, dim=0)",
            vec![of(&[6, 4], DType::F64), index(&[3, 4], 6, DType::I64)],
            None,
        ),
        (
            "embedding_bf16",
            "%i: i64[2,3], %w: bf16[9,5]",
            "%y = embedding(%i, %w)",
            vec![index(&[2, 3], 9, DType::I64), of(&[9, 5], DType::BF16)],
            None,
        ),
        (
            "cat_mixed",
            "%x: f32[2,3], %z: i32[4,3], %w: f16[1,3], %e: f32[0]",
            "%y = cat(%x, %z, %w, %e, dim=0)",
            vec![
                f32s(&[2, 3]),
                of(&[4, 3], DType::I32),
                of(&[1, 3], DType::F16),
                f32s(&[0]),
            ],
            None,
        ),
        (
            "stack_last",
            "%x: f32[3,4], %z: f32[3,4]",
            "%t = t(%z)\n %u = t(%t)\n %y = stack(%x, %u, dim=-1)",
            vec![f32s(&[3, 4]), f32s(&[3, 4])],
            None,
        ),
        (
            "repeat_lead",
            "%x: i64[2,3]",
            "%y = repeat(%x, repeats=[2,2,1])",
            vec![of(&[2, 3], DType::I64)],
            None,
        ),
        (
            "flip_sliced",
            "%x: f32[4,9]",
            "%s = narrow(%x, dim=1, start=2, length=5)\n %y = flip(%s, dims=[0,-1])",
            vec![f32s(&[4, 9])],
            None,
        ),
        (
            "tril",
            "%x: f32[4,6]",
            "%y = tril(%x, diagonal=-1)",
            vec![f32s(&[4, 6])],
            None,
        ),
        (
            "triu_bool",
            "%x: bool[2,4,3]",
            "%y = triu(%x, diagonal=1)",
            vec![index(&[2, 4, 3], 2, DType::Bool)],
            None,
        ),
        (
            "scatter_rows",
            "%x: f32[4,6], %i: i64[3,2], %s: f32[3,5]",
            "%y = scatter(%x, %i, %s, dim=1)",
            vec![f32s(&[4, 6]), index(&[3, 2], 6, DType::I64), f32s(&[3, 5])],
            None,
        ),
        (
            "scatter_add_dups",
            "%x: f32[5,3], %i: i64[7,3], %s: f32[7,3]",
            "%y = scatter_add(%x, %i, %s, dim=0)",
            vec![f32s(&[5, 3]), index(&[7, 3], 2, DType::I64), f32s(&[7, 3])],
            None,
        ),
        (
            "scatter_add_i32",
            "%x: i32[3,4], %i: i64[3,4], %s: i32[3,4]",
            "%y = scatter_add(%x, %i, %s, dim=1)",
            vec![
                of(&[3, 4], DType::I32),
                index(&[3, 4], 4, DType::I64),
                of(&[3, 4], DType::I32),
            ],
            None,
        ),
        (
            "index_add",
            "%x: f64[6,3], %i: i32[4], %s: f64[4,3]",
            "%y = index_add(%x, %i, %s, dim=0)",
            vec![
                of(&[6, 3], DType::F64),
                index(&[4], 6, DType::I32),
                of(&[4, 3], DType::F64),
            ],
            None,
        ),
        (
            "scatter_bad",
            "%x: f32[4,3], %i: i64[2,3], %s: f32[2,3]",
            "%y = scatter_add(%x, %i, %s, dim=0)",
            vec![
                f32s(&[4, 3]),
                Tensor::from_vec(vec![0i64, 1, 2, 3, 4, 0], &[2, 3]).unwrap(),
                f32s(&[2, 3]),
            ],
            Some(INDEX_ERROR),
        ),
        // more entries than a gather scans: a copy, then atomic adds; integer values, so
        // that every order of the adds gives the same sums
        (
            "scatter_add_long",
            "%x: f32[5,3], %i: i64[300,3], %s: f32[300,3]",
            "%y = scatter_add(%x, %i, %s, dim=0)",
            vec![
                ints(&[5, 3], DType::F32),
                index(&[300, 3], 5, DType::I64),
                ints(&[300, 3], DType::F32),
            ],
            None,
        ),
        (
            "scatter_add_long_i64_view",
            "%x: i64[4,2], %i: i64[2,500], %s: i64[500,2]",
            "%t = t(%s)\n %y = scatter_add(%t, %i, %t, dim=1)",
            vec![
                ints(&[4, 2], DType::I64),
                index(&[2, 500], 4, DType::I64),
                ints(&[500, 2], DType::I64),
            ],
            None,
        ),
        (
            "index_add_long_f16",
            "%x: f16[6,4], %i: i32[400], %s: f16[400,4]",
            "%y = index_add(%x, %i, %s, dim=0)",
            vec![
                ints(&[6, 4], DType::F16),
                index(&[400], 6, DType::I32),
                ints(&[400, 4], DType::F16),
            ],
            None,
        ),
        (
            "index_add_long_bf16",
            "%x: bf16[3,5], %i: i64[260], %s: bf16[3,260]",
            "%y = index_add(%x, %i, %s, dim=1)",
            vec![
                ints(&[3, 5], DType::BF16),
                index(&[260], 5, DType::I64),
                ints(&[3, 260], DType::BF16),
            ],
            None,
        ),
        (
            "scatter_long_unique",
            "%x: f64[300,2], %i: i64[280,2], %s: f64[280,2]",
            "%y = scatter(%x, %i, %s, dim=0)",
            vec![
                of(&[300, 2], DType::F64),
                Tensor::from_vec(
                    (0..280i64)
                        .flat_map(|k| [k * 7 % 300, (k * 11 + 5) % 300])
                        .collect(),
                    &[280, 2],
                )
                .unwrap(),
                of(&[280, 2], DType::F64),
            ],
            None,
        ),
        (
            "scatter_add_long_bad",
            "%x: f32[5,3], %i: i64[300,3], %s: f32[300,3]",
            "%y = scatter_add(%x, %i, %s, dim=0)",
            vec![
                f32s(&[5, 3]),
                {
                    // the last entry is out of range
                    let i = index(&[300, 3], 5, DType::I64);
                    i.narrow(0, 299, 1).unwrap().fill_(5).unwrap();
                    i
                },
                f32s(&[300, 3]),
            ],
            Some(INDEX_ERROR),
        ),
        (
            "scatter_add_into_empty",
            "%x: f32[0,3], %i: i64[2,3], %s: f32[2,3]",
            "%y = scatter_add(%x, %i, %s, dim=0)",
            vec![f32s(&[0, 3]), index(&[2, 3], 1, DType::I64), f32s(&[2, 3])],
            Some(INDEX_ERROR),
        ),
        (
            "index_out_of_range",
            "%x: f32[5,3], %i: i64[3]",
            "%y = index_select(%x, %i, dim=0)",
            vec![
                f32s(&[5, 3]),
                Tensor::from_vec(vec![1i64, 5, 0], &[3]).unwrap(),
            ],
            Some(INDEX_ERROR),
        ),
        (
            "gather_negative",
            "%x: f32[5,3], %i: i64[2,3]",
            "%y = gather(%x, %i, dim=0)",
            vec![
                f32s(&[5, 3]),
                Tensor::from_vec(vec![0i64, 1, 2, 3, -1, 4], &[2, 3]).unwrap(),
            ],
            Some(INDEX_ERROR),
        ),
    ];
    let mut unit = Unit::default();
    for (name, params, body, ins, raises) in cases {
        let g = graph_of(name, params, body);
        for fuse in [true, false] {
            unit.add(name, &g, fuse);
            let c = unit.cases.last_mut().unwrap();
            assert!(
                c.name.starts_with(name),
                "{test}: {name} is not a kernel program"
            );
            c.inputs = Some(ins.clone());
            c.raises = raises;
        }
    }
    assert!(
        unit.skipped.is_empty(),
        "{test}: skipped {:?}",
        unit.skipped
    );
    let lib = unit.build(&cxx, "indexing");
    check(&unit, &lib);
}
