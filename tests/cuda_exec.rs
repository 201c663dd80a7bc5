//! Execution on a GPU, checked against the CPU interpreter: every op of ir-format.md
//! version 1 and every example model (fused and unfused), eager device tensors (copies,
//! views, matmul through cuBLAS, in-place ops), memory statistics and errors.
//!
//! Without a GPU the execution tests print why and pass (with `SMELT_REQUIRE_GPU=1` they
//! fail instead), and the tests of the missing-GPU errors run.

mod common;

use common::cuda_cases::CASES;
use common::cuda_check::{assert_matches, graph_of, inputs};
use common::{smelt, temp_dir};
use smelt::data::{DataLoader, TensorDataset};
use smelt::exec::{CompileOptions, CudaFn};
use smelt::ir::graph::Graph;
use smelt::ir::parse_module;
use smelt::runtime::cuda::{self, memory};
use smelt::runtime::interp;
use smelt::{DType, Device, Tensor};

fn gpu_or_skip(test: &str) -> bool {
    if cuda::is_available() && smelt::codegen_cuda::nvrtc::is_available() {
        return true;
    }
    let why = match cuda::device_count() {
        Err(e) => e.to_string(),
        Ok(0) => "no CUDA device".into(),
        Ok(_) => "NVRTC is not available".into(),
    };
    if std::env::var("SMELT_REQUIRE_GPU").as_deref() == Ok("1") {
        panic!("{test}: SMELT_REQUIRE_GPU=1 but {why}");
    }
    eprintln!("{test}: skipped, {why}");
    false
}

const GPU: Device = Device::Cuda(0);

/// Runs `g` on the interpreter and on the GPU (fused and unfused) and compares.
fn check_graph(name: &str, g: &Graph) {
    let host = inputs(g);
    let named: Vec<(&str, Tensor)> = g
        .inputs()
        .iter()
        .zip(&host)
        .map(|(&v, t)| (g.node(v).name.as_str(), t.clone()))
        .collect();
    let want = interp::run(g, &named);
    let dev: Vec<Tensor> = host.iter().map(|t| t.to_device(GPU).unwrap()).collect();
    for fuse in [true, false] {
        let opts = CompileOptions::default().fused(fuse);
        let f = CudaFn::compile(g, &opts).unwrap_or_else(|e| panic!("{name}: {e}"));
        let got = f.call(&dev);
        match (&want, got) {
            (Ok(want), Ok(got)) => {
                assert_eq!(got.len(), want.len(), "{name}: outputs");
                for (i, (gt, wt)) in got.iter().zip(want).enumerate() {
                    assert_eq!(gt.device(), GPU, "{name}: output on the GPU");
                    let host = gt.cpu().unwrap();
                    assert_matches(&format!("{name} (fuse={fuse}) output {i}"), &host, wt);
                }
            }
            (Err(a), Err(b)) => assert_eq!(a.to_string(), b.to_string(), "{name}: errors"),
            (w, g) => panic!("{name} (fuse={fuse}): interpreter {w:?} vs GPU {g:?}"),
        }
    }
}

#[test]
fn every_op_matches_the_interpreter_on_the_gpu() {
    if !gpu_or_skip("every_op_matches_the_interpreter_on_the_gpu") {
        return;
    }
    smelt::runtime::random::manual_seed(1);
    for (name, params, body) in CASES {
        check_graph(name, &graph_of(name, params, body));
    }
}

#[test]
fn every_example_model_matches_the_interpreter_on_the_gpu() {
    if !gpu_or_skip("every_example_model_matches_the_interpreter_on_the_gpu") {
        return;
    }
    smelt::runtime::random::manual_seed(2);
    let dir = concat!(env!("CARGO_MANIFEST_DIR"), "/examples/models");
    let mut files: Vec<_> = std::fs::read_dir(dir).unwrap().flatten().collect();
    files.sort_by_key(|e| e.path());
    for e in files {
        let p = e.path();
        if p.extension().and_then(|x| x.to_str()) != Some("smelt") {
            continue;
        }
        let text = std::fs::read_to_string(&p).unwrap();
        let m = parse_module(&text, &p.display().to_string()).unwrap();
        for g in &m.graphs {
            check_graph(&format!("{}:{}", p.display(), g.name), g);
        }
    }
}

#[test]
fn large_and_odd_sizes_match_the_interpreter() {
    if !gpu_or_skip("large_and_odd_sizes_match_the_interpreter") {
        return;
    }
    smelt::runtime::random::manual_seed(3);
    let cases = [
        (
            "chain",
            "%x: f32[1000,4097], %b: f32[4097]",
            "%r = relu(%x)\n %h = mul(%r, 0.5)\n %y = add(%h, %b)",
        ),
        (
            "softmax_long",
            "%x: f32[3,5000]",
            "%y = softmax(%x, dim=-1)",
        ),
        (
            "softmax_cols",
            "%x: f32[300,7]",
            "%t = t(%x)\n %y = softmax(%t, dim=-1)",
        ),
        (
            "layer_norm",
            "%x: f32[33,1025], %w: f32[1025], %b: f32[1025]",
            "%y = layer_norm(%x, %w, %b, normalized_shape=[1025])",
        ),
        ("sum_rows", "%x: f32[513,2049]", "%y = sum(%x, dim=[1])"),
        ("sum_cols", "%x: f32[513,2049]", "%y = sum(%x, dim=[0])"),
        ("mean_all", "%x: f64[100001]", "%y = mean(%x)"),
        ("amax", "%x: bf16[65,257]", "%y = amax(%x, dim=[1])"),
        ("size_one", "%x: f32[1,1]", "%y = exp(%x)"),
    ];
    for (name, params, body) in cases {
        check_graph(name, &graph_of(name, params, body));
    }
}

#[test]
fn tensors_move_between_host_and_gpu_unchanged() {
    if !gpu_or_skip("tensors_move_between_host_and_gpu_unchanged") {
        return;
    }
    for d in [
        DType::Bool,
        DType::U8,
        DType::I8,
        DType::I16,
        DType::I32,
        DType::I64,
        DType::F16,
        DType::BF16,
        DType::F32,
        DType::F64,
    ] {
        let x = Tensor::arange(0.0, 24.0, 1.0, None)
            .unwrap()
            .to_dtype(d)
            .unwrap()
            .reshape(&[2, 3, 4])
            .unwrap();
        let g = x.cuda().unwrap();
        assert_eq!(g.device(), GPU);
        assert_eq!(g.cpu().unwrap().to_f64_vec(), x.to_f64_vec(), "{d}");
        // a transposed, sliced view travels as its elements
        let v = x
            .transpose(0, 2)
            .unwrap()
            .slice(0, Some(1), Some(4), 2)
            .unwrap();
        let gv = g
            .transpose(0, 2)
            .unwrap()
            .slice(0, Some(1), Some(4), 2)
            .unwrap();
        assert_eq!(gv.cpu().unwrap().to_f64_vec(), v.to_f64_vec(), "{d} view");
        assert_eq!(
            v.cuda().unwrap().cpu().unwrap().to_f64_vec(),
            v.to_f64_vec()
        );
    }
    // the same device: no copy
    let g = Tensor::ones(&[3], DType::F32).cuda().unwrap();
    assert!(g.to_device(GPU).unwrap().shares_storage(&g));
}

#[test]
fn eager_ops_on_gpu_views_match_the_cpu() {
    if !gpu_or_skip("eager_ops_on_gpu_views_match_the_cpu") {
        return;
    }
    smelt::runtime::random::manual_seed(4);
    let a = Tensor::randn(&[6, 5], None).unwrap();
    let b = Tensor::randn(&[5], None).unwrap();
    let (ga, gb) = (a.cuda().unwrap(), b.cuda().unwrap());
    let cpu = a.t().unwrap().relu().unwrap().mul_scalar(0.5).unwrap();
    let gpu = ga.t().unwrap().relu().unwrap().mul_scalar(0.5).unwrap();
    assert_eq!(gpu.device(), GPU);
    assert_matches("relu(t(a))*0.5", &gpu.cpu().unwrap(), &cpu);
    let cpu = a
        .add(&b)
        .unwrap()
        .softmax(-1)
        .unwrap()
        .sum_dim(&[0], false)
        .unwrap();
    let gpu = ga
        .add(&gb)
        .unwrap()
        .softmax(-1)
        .unwrap()
        .sum_dim(&[0], false)
        .unwrap();
    assert_matches("sum(softmax(a+b))", &gpu.cpu().unwrap(), &cpu);
    // a reshape that needs a copy
    let cpu = a.t().unwrap().reshape(&[30]).unwrap();
    let gpu = ga.t().unwrap().reshape(&[30]).unwrap();
    assert_matches("reshape(t(a))", &gpu.cpu().unwrap(), &cpu);
    // printing shows the values and the device
    let s = format!("{}", Tensor::ones(&[2], DType::F32).cuda().unwrap());
    assert!(s.contains("1.") && s.contains("device='cuda:0'"), "{s}");
}

#[test]
fn matmul_through_cublas_matches_the_cpu() {
    if !gpu_or_skip("matmul_through_cublas_matches_the_cpu") {
        return;
    }
    smelt::runtime::random::manual_seed(5);
    let cases: &[(&[usize], &[usize])] = &[
        (&[7, 5], &[5, 3]),
        (&[5], &[5, 3]),
        (&[7, 5], &[5]),
        (&[5], &[5]),
        (&[2, 1, 7, 5], &[4, 5, 3]),
        (&[3, 7, 5], &[5, 9]),
        (&[64, 0], &[0, 8]),
        (&[0, 4], &[4, 2]),
        (&[129, 257], &[257, 65]),
    ];
    for &(sa, sb) in cases {
        let a = Tensor::randn(sa, None).unwrap();
        let b = Tensor::randn(sb, None).unwrap();
        let want = a.matmul(&b).unwrap();
        let got = a.cuda().unwrap().matmul(&b.cuda().unwrap()).unwrap();
        assert_matches(&format!("{sa:?}@{sb:?}"), &got.cpu().unwrap(), &want);
    }
    // transposed and sliced operands (read through strides or copied)
    let a = Tensor::randn(&[9, 7], None).unwrap();
    let b = Tensor::randn(&[11, 9], None).unwrap();
    let want = a.t().unwrap().matmul(&b.t().unwrap()).unwrap();
    let (ga, gb) = (a.cuda().unwrap(), b.cuda().unwrap());
    let got = ga.t().unwrap().matmul(&gb.t().unwrap()).unwrap();
    assert_matches("a.t()@b.t()", &got.cpu().unwrap(), &want);
    let want = a.slice(1, Some(0), Some(7), 2).unwrap();
    let want = b.matmul(&want).unwrap();
    let got = gb
        .matmul(&ga.slice(1, Some(0), Some(7), 2).unwrap())
        .unwrap();
    assert_matches("b@a[:, ::2]", &got.cpu().unwrap(), &want);
    // f64 exactly as cuBLAS computes it: close to the CPU's
    let a = Tensor::randn(&[31, 17], Some(DType::F64)).unwrap();
    let got = a
        .cuda()
        .unwrap()
        .matmul(&a.t().unwrap().cuda().unwrap())
        .unwrap();
    assert_matches(
        "f64",
        &got.cpu().unwrap(),
        &a.matmul(&a.t().unwrap()).unwrap(),
    );
    // f16 on tensor cores, f32 accumulation: within half precision of the f32 product
    let a = Tensor::randn(&[64, 128], None).unwrap();
    let b = Tensor::randn(&[128, 32], None).unwrap();
    let want = a.matmul(&b).unwrap();
    let got = a
        .to_dtype(DType::F16)
        .unwrap()
        .cuda()
        .unwrap()
        .matmul(&b.to_dtype(DType::F16).unwrap().cuda().unwrap())
        .unwrap();
    let got = got
        .cpu()
        .unwrap()
        .to_dtype(DType::F32)
        .unwrap()
        .to_f64_vec();
    let norm: f64 = want.to_f64_vec().iter().map(|x| x * x).sum::<f64>().sqrt();
    let err: f64 = got
        .iter()
        .zip(want.to_f64_vec())
        .map(|(g, w)| (g - w) * (g - w))
        .sum::<f64>()
        .sqrt();
    assert!(
        err / norm < 5e-3,
        "f16 matmul relative error {}",
        err / norm
    );
}

#[test]
fn in_place_ops_write_through_gpu_views() {
    if !gpu_or_skip("in_place_ops_write_through_gpu_views") {
        return;
    }
    let x = Tensor::arange(0.0, 12.0, 1.0, None)
        .unwrap()
        .reshape(&[3, 4])
        .unwrap();
    let g = x.cuda().unwrap();
    let v = g.slice(1, Some(1), Some(4), 2).unwrap(); // columns 1 and 3
    v.add_scalar_(100.0).unwrap();
    g.select(0, 0).unwrap().fill_(-1.0).unwrap();
    let col = Tensor::from_vec(vec![7.0f32, 8.0, 9.0], &[3, 1])
        .unwrap()
        .cuda()
        .unwrap();
    g.narrow(1, 0, 1).unwrap().copy_(&col).unwrap();
    let want = vec![
        7.0, -1.0, -1.0, -1.0, //
        8.0, 105.0, 6.0, 107.0, //
        9.0, 109.0, 10.0, 111.0,
    ];
    assert_eq!(g.cpu().unwrap().to_f64_vec(), want);
    // the version counter moved with the writes
    assert!(g.version() >= 3);
}

#[test]
fn device_memory_is_counted_and_cached() {
    if !gpu_or_skip("device_memory_is_counted_and_cached") {
        return;
    }
    let before = memory::memory_allocated(0).unwrap();
    let t = Tensor::zeros(&[1 << 20], DType::F32).cuda().unwrap();
    let held = memory::memory_allocated(0).unwrap();
    assert!(held >= before + (4 << 20), "{before} -> {held}");
    let reserved = memory::memory_reserved(0).unwrap();
    drop(t);
    assert!(memory::memory_allocated(0).unwrap() < held);
    // freed blocks stay reserved until empty_cache
    assert_eq!(memory::memory_reserved(0).unwrap(), reserved);
    assert!(memory::max_memory_allocated(0).unwrap() >= held);
    memory::empty_cache(0).unwrap();
}

#[test]
fn gpu_errors_are_clean() {
    if !gpu_or_skip("gpu_errors_are_clean") {
        return;
    }
    let a = Tensor::ones(&[3], DType::F32);
    let g = a.cuda().unwrap();
    let e = g.add(&a).unwrap_err().to_string();
    assert!(
        e.contains("Expected all tensors to be on the same device, but found at least two devices, cuda:0 and cpu!"),
        "{e}"
    );
    // integer remainder by zero, as on the CPU
    let x = Tensor::from_vec(vec![5i64, 6], &[2])
        .unwrap()
        .cuda()
        .unwrap();
    let z = Tensor::from_vec(vec![1i64, 0], &[2])
        .unwrap()
        .cuda()
        .unwrap();
    let e = x.remainder(&z).unwrap_err().to_string();
    assert!(e.contains("ZeroDivisionError"), "{e}");
    // a compiled function refuses host inputs
    let g2 = graph_of("neg", "%x: f32[3]", "%y = neg(%x)");
    let f = CudaFn::compile(&g2, &CompileOptions::default()).unwrap();
    let e = f.call(&[a]).err().unwrap().to_string();
    assert!(e.contains("is on cpu"), "{e}");
    let e = Tensor::ones(&[1], DType::F32)
        .to_device(Device::Cuda(99))
        .unwrap_err()
        .to_string();
    assert!(e.contains("invalid device ordinal"), "{e}");
}

#[test]
fn smelt_profile_runs_on_the_gpu() {
    if !gpu_or_skip("smelt_profile_runs_on_the_gpu") {
        return;
    }
    let model = concat!(env!("CARGO_MANIFEST_DIR"), "/examples/models/softmax.smelt");
    let out = smelt(&["profile", model, "--backend", "cuda", "--repeat", "2"]);
    let text = String::from_utf8_lossy(&out.stdout);
    assert!(
        out.status.success(),
        "{text}{}",
        String::from_utf8_lossy(&out.stderr)
    );
    assert!(text.contains("of the measured copy"), "{text}");
}

#[test]
fn without_a_gpu_asking_for_one_is_an_error() {
    if cuda::is_available() {
        eprintln!("without_a_gpu_asking_for_one_is_an_error: skipped, a GPU is present");
        return;
    }
    let e = Tensor::ones(&[2], DType::F32)
        .cuda()
        .unwrap_err()
        .to_string();
    assert!(
        e.to_lowercase().contains("cuda") || e.contains("driver"),
        "{e}"
    );
    for e in [
        cuda::current_device().map(|_| ()),
        cuda::set_device(0),
        cuda::synchronize(),
    ] {
        let e = e.unwrap_err().to_string();
        assert!(e.contains("CUDA") || e.contains("driver"), "{e}");
    }
    let e = CudaFn::compile(
        &graph_of("neg", "%x: f32[3]", "%y = neg(%x)"),
        &Default::default(),
    )
    .err()
    .unwrap()
    .to_string();
    assert!(!e.is_empty());
    let model = concat!(env!("CARGO_MANIFEST_DIR"), "/examples/models/softmax.smelt");
    // an output directory that does not exist
    let tmp = temp_dir("no-gpu");
    let dir = tmp.join("out").display().to_string();
    for cmd in [
        vec!["profile", model, "--backend", "cuda"],
        vec!["run", model, "--backend", "cuda", "--out", &dir],
    ] {
        let out = smelt(&cmd);
        let err = String::from_utf8_lossy(&out.stderr);
        assert!(!out.status.success());
        assert!(!err.contains("panicked"), "{err}");
        assert!(err.contains("driver") || err.contains("CUDA"), "{err}");
    }
}

#[test]
fn gpu_indexing_kernels_match_the_cpu_and_its_errors() {
    if !gpu_or_skip("gpu_indexing_kernels_match_the_cpu_and_its_errors") {
        return;
    }
    let g = graph_of(
        "isel",
        "%x: f32[5,3], %i: i64[4]",
        "%y = index_select(%x, %i, dim=0)",
    );
    let f = CudaFn::compile(&g, &Default::default()).unwrap();
    // the op runs as a generated kernel, not through the host
    assert!(
        f.program()
            .kernels
            .iter()
            .any(|k| k.ir_name == "index_select")
    );
    let x = Tensor::randn(&[5, 3], Some(DType::F32)).unwrap();
    let run = |idx: Vec<i64>| {
        let i = Tensor::from_vec(idx, &[4]).unwrap();
        let want = interp::run(&g, &[("x", x.clone()), ("i", i.clone())]);
        let got = f.call(&[x.to_device(GPU).unwrap(), i.to_device(GPU).unwrap()]);
        (want, got)
    };
    let (want, got) = run(vec![4, 0, 0, 2]);
    assert_matches(
        "index_select",
        &got.unwrap()[0].cpu().unwrap(),
        &want.unwrap()[0],
    );
    let (want, got) = run(vec![1, 5, 0, 2]);
    assert_eq!(got.unwrap_err().to_string(), want.unwrap_err().to_string());

    // a long scatter_add: a copy, then atomic adds of whole numbers (exact in any order)
    let g = graph_of(
        "long",
        "%x: f32[5,3], %i: i64[3000,3], %s: f32[3000,3]",
        "%y = scatter_add(%x, %i, %s, dim=0)",
    );
    let f = CudaFn::compile(&g, &Default::default()).unwrap();
    let atomics = f
        .program()
        .kernels
        .iter()
        .filter(|k| k.source.contains("atomicAdd"));
    assert_eq!(atomics.count(), 1);
    let whole = |shape: &[usize]| {
        Tensor::randint(-4, 5, shape, Some(DType::I64))
            .and_then(|t| t.to_dtype(DType::F32))
            .unwrap()
    };
    let (x, s) = (whole(&[5, 3]), whole(&[3000, 3]));
    let i = Tensor::randint(0, 5, &[3000, 3], Some(DType::I64)).unwrap();
    let want = interp::run(&g, &[("x", x.clone()), ("i", i.clone()), ("s", s.clone())]);
    let on = |t: &Tensor| t.to_device(GPU).unwrap();
    let got = f.call(&[on(&x), on(&i), on(&s)]).unwrap();
    assert_matches("scatter_add", &got[0].cpu().unwrap(), &want.unwrap()[0]);
}

#[test]
fn the_current_device_receives_cuda_tensors() {
    if !gpu_or_skip("the_current_device_receives_cuda_tensors") {
        return;
    }
    assert_eq!(cuda::current_device().unwrap(), 0);
    let n = cuda::device_count().unwrap();
    let e = cuda::set_device(n).unwrap_err().to_string();
    assert!(e.contains("invalid device ordinal"), "{e}");
    cuda::set_device(n - 1).unwrap();
    let t = Tensor::ones(&[4], DType::F32).cuda().unwrap();
    assert_eq!(t.device(), Device::Cuda(n - 1));
    cuda::synchronize().unwrap();
    // another thread starts on device 0 again, as in PyTorch
    let other = std::thread::spawn(cuda::current_device).join().unwrap();
    assert_eq!(other.unwrap(), 0);
    cuda::set_device(0).unwrap();
    assert!(cuda::environment_report().contains("current device: cuda:0"));
}

#[test]
fn without_a_gpu_memory_cannot_be_pinned() {
    if cuda::is_available() {
        eprintln!("without_a_gpu_memory_cannot_be_pinned: skipped, a GPU is present");
        return;
    }
    let t = Tensor::ones(&[3, 2], DType::F32);
    assert!(!t.is_pinned());
    let e = t.pin_memory().unwrap_err().to_string();
    assert!(
        e.to_lowercase().contains("cuda") || e.contains("driver"),
        "{e}"
    );
    // a loader asked to pin gives the same batches in ordinary memory
    let x = Tensor::arange(0.0, 20.0, 1.0, Some(DType::F32))
        .and_then(|t| t.reshape(&[10, 2]))
        .unwrap();
    let data = || TensorDataset::new(vec![x.clone()]).unwrap();
    let mut pinned = DataLoader::new(data(), 4)
        .unwrap()
        .pin_memory(true)
        .num_workers(2);
    let mut plain = DataLoader::new(data(), 4).unwrap();
    let a: Vec<Vec<Tensor>> = pinned.iter().unwrap().map(|b| b.unwrap()).collect();
    let b: Vec<Vec<Tensor>> = plain.iter().unwrap().map(|b| b.unwrap()).collect();
    assert_eq!(a.len(), 3);
    for (a, b) in a.iter().zip(&b) {
        assert!(!a[0].is_pinned());
        assert_eq!(a[0].to_f64_vec(), b[0].to_f64_vec());
    }
}

#[test]
fn pinned_memory_holds_the_values_and_feeds_the_gpu() {
    if !gpu_or_skip("pinned_memory_holds_the_values_and_feeds_the_gpu") {
        return;
    }
    smelt::runtime::random::manual_seed(5);
    let x = Tensor::randn(&[37, 9], Some(DType::F32)).unwrap();
    for (what, t) in [("dense", x.clone()), ("transposed", x.t().unwrap())] {
        let p = t.pin_memory().unwrap();
        assert!(p.is_pinned() && p.is_contiguous(), "{what}");
        assert!(!t.is_pinned(), "{what}: the source stays as it was");
        assert_eq!(p.shape(), t.shape(), "{what}");
        assert_eq!(p.to_f64_vec(), t.to_f64_vec(), "{what}");
        // pinning pinned memory is a no-op; the GPU copy round-trips exactly
        assert!(p.pin_memory().unwrap().shares_storage(&p), "{what}");
        let back = p.to_device(GPU).and_then(|d| d.cpu()).unwrap();
        assert_eq!(back.to_f64_vec(), t.to_f64_vec(), "{what}");
        // ordinary ops read pinned tensors like any other
        let y = p.mul_scalar(2.0).unwrap();
        assert_eq!(
            y.to_f64_vec(),
            t.mul_scalar(2.0).unwrap().to_f64_vec(),
            "{what}"
        );
    }
    let empty = Tensor::zeros(&[0, 4], DType::I64).pin_memory().unwrap();
    assert!(empty.is_pinned() && empty.numel() == 0);
    let e = x
        .to_device(GPU)
        .unwrap()
        .pin_memory()
        .unwrap_err()
        .to_string();
    assert!(e.contains("cannot pin"), "{e}");
    let mut loader = DataLoader::new(TensorDataset::new(vec![x.clone()]).unwrap(), 8)
        .unwrap()
        .pin_memory(true)
        .num_workers(2);
    let mut rows = 0;
    for batch in loader.iter().unwrap() {
        let batch = batch.unwrap();
        assert!(batch[0].is_pinned());
        rows += batch[0].shape()[0];
    }
    assert_eq!(rows, 37);
}

#[test]
fn autocast_runs_gpu_matmuls_in_low_precision() {
    if !gpu_or_skip("autocast_runs_gpu_matmuls_in_low_precision") {
        return;
    }
    let a = Tensor::randn(&[16, 32], None).unwrap();
    let b = Tensor::randn(&[32, 8], None).unwrap();
    let want = a.matmul(&b).unwrap();
    for d in [DType::BF16, DType::F16] {
        let _guard = smelt::amp::autocast(d).unwrap();
        let y = a.cuda().unwrap().matmul(&b.cuda().unwrap()).unwrap();
        assert_eq!((y.dtype(), y.device()), (d, GPU));
        let got = y.cpu().unwrap().to_dtype(DType::F32).unwrap();
        for (g, w) in got.to_f64_vec().iter().zip(want.to_f64_vec()) {
            assert!((g - w).abs() <= 0.1 * (1.0 + w.abs()), "{d}: {g} vs {w}");
        }
    }
}

#[test]
fn smelt_grad_and_run_on_the_gpu_match_the_cpu() {
    if !gpu_or_skip("smelt_grad_and_run_on_the_gpu_match_the_cpu") {
        return;
    }
    let dir = temp_dir("grad");
    let model = concat!(
        env!("CARGO_MANIFEST_DIR"),
        "/examples/models/mlp_block.smelt"
    );
    let m = parse_module(&std::fs::read_to_string(model).unwrap(), model).unwrap();
    let g = &m.graphs[0];
    let mut args: Vec<String> = Vec::new();
    for (&v, t) in g.inputs().iter().zip(inputs(g)) {
        let name = &g.node(v).name;
        let f = dir.join(format!("{name}.npy"));
        smelt::runtime::npy::write_npy(&f, &t).unwrap();
        args.push("--input".into());
        args.push(format!("{name}={}", f.display()));
    }
    for cmd in ["grad", "run"] {
        let mut outs = Vec::new();
        for backend in ["cpu", "cuda"] {
            let out_dir = dir.join(format!("{cmd}-{backend}"));
            let mut a: Vec<String> = vec![cmd.into(), model.into()];
            if cmd == "grad" {
                a.extend(["--wrt".into(), "x,w1".into()]);
            }
            a.extend(args.iter().cloned());
            a.extend([
                "--backend".into(),
                backend.into(),
                "--out".into(),
                out_dir.display().to_string(),
            ]);
            let o = smelt(&a);
            assert!(
                o.status.success(),
                "{cmd} {backend}: {}",
                String::from_utf8_lossy(&o.stderr)
            );
            outs.push(out_dir);
        }
        let mut files: Vec<_> = std::fs::read_dir(&outs[0])
            .unwrap()
            .flatten()
            .map(|e| e.file_name())
            .collect();
        files.sort();
        assert!(!files.is_empty());
        for f in files {
            let c = smelt::runtime::npy::read_npy(outs[0].join(&f)).unwrap();
            let d = smelt::runtime::npy::read_npy(outs[1].join(&f)).unwrap();
            assert_matches(&format!("{cmd} {f:?}"), &d, &c);
        }
    }
}

#[test]
fn without_a_gpu_streams_and_events_are_errors() {
    if cuda::is_available() {
        eprintln!("without_a_gpu_streams_and_events_are_errors: skipped, a GPU is present");
        return;
    }
    let cuda_error = |e: smelt::Error| {
        let e = e.to_string();
        assert!(
            e.to_lowercase().contains("cuda") || e.contains("driver"),
            "{e}"
        );
    };
    cuda_error(cuda::Stream::new().unwrap_err());
    cuda_error(cuda::current_stream().unwrap_err());
    cuda_error(cuda::Stream::default_stream(0).unwrap_err());
    cuda_error(cuda::Event::new(true).unwrap_err());
    let t = Tensor::ones(&[2], DType::F32);
    cuda_error(t.to_device_non_blocking(GPU).unwrap_err());
    // a CPU move needs no GPU
    let same = t.to_device_non_blocking(Device::Cpu).unwrap();
    assert!(same.shares_storage(&t));
}

#[test]
fn streams_order_their_work_and_events_time_it() {
    if !gpu_or_skip("streams_order_their_work_and_events_time_it") {
        return;
    }
    smelt::runtime::random::manual_seed(8);
    let g = graph_of(
        "chain",
        "%x: f32[513,67]",
        "%a = relu(%x)\n %b = mul(%a, 0.5)\n %y = tanh(%b)",
    );
    let f = CudaFn::compile(&g, &Default::default()).unwrap();
    let x = Tensor::randn(&[513, 67], Some(DType::F32)).unwrap();
    let want = interp::run(&g, &[("x", x.clone())]).unwrap();

    let s = cuda::Stream::new().unwrap();
    assert!(!s.is_default());
    assert_eq!(s.device(), 0);
    assert!(cuda::current_stream().unwrap().is_default());
    let start = cuda::Event::new(true).unwrap();
    let end = cuda::Event::new(true).unwrap();
    let (y, eager) = cuda::with_stream(&s, || {
        assert_eq!(cuda::current_stream().unwrap(), s);
        start.record(&s).unwrap();
        let d = x.pin_memory().unwrap().to_device_non_blocking(GPU).unwrap();
        let y = f.call(std::slice::from_ref(&d)).unwrap();
        // eager ops and a strided copy queue on the stream too
        let eager = d
            .relu()
            .and_then(|a| a.mul_scalar(0.5))
            .and_then(|b| b.tanh());
        let eager = eager
            .and_then(|e| e.t())
            .and_then(|e| e.contiguous())
            .unwrap();
        end.record(&s).unwrap();
        (y, eager)
    })
    .unwrap();
    assert!(cuda::current_stream().unwrap().is_default(), "restored");
    s.synchronize().unwrap();
    assert!(s.query().unwrap() && end.query().unwrap());
    assert!(start.elapsed_ms(&end).unwrap() >= 0.0);
    assert_matches("stream", &y[0].cpu().unwrap(), &want[0]);
    assert_matches(
        "eager on a stream",
        &eager.cpu().unwrap(),
        &want[0].t().unwrap().contiguous().unwrap(),
    );

    // a second stream waits for the first: its read sees the first's write
    let s2 = cuda::Stream::new().unwrap();
    let big = Tensor::ones(&[1 << 20], DType::F32).cuda().unwrap();
    cuda::with_stream(&s, || big.mul_scalar_(3.0).map(|_| ()))
        .unwrap()
        .unwrap();
    s2.wait_stream(&s).unwrap();
    let sum = cuda::with_stream(&s2, || big.sum()).unwrap().unwrap();
    assert_eq!(
        sum.cpu().unwrap().to_f64_vec(),
        vec![3.0 * (1 << 20) as f64]
    );
    // an event of another stream orders work too
    let e = s2.record_event().unwrap();
    s.wait_event(&e).unwrap();
    cuda::synchronize().unwrap();
}

#[test]
fn memory_used_on_another_stream_waits_before_reuse() {
    if !gpu_or_skip("memory_used_on_another_stream_waits_before_reuse") {
        return;
    }
    let (s1, s2) = (cuda::Stream::new().unwrap(), cuda::Stream::new().unwrap());
    let n = 1 << 22;
    let on = |s: &cuda::Stream| cuda::with_stream(s, || Tensor::zeros(&[n], DType::F32).cuda());
    let a = on(&s1).unwrap().unwrap();
    let ptr = a.data_ptr();
    a.record_stream(&s2).unwrap();
    let before = memory::memory_allocated(0).unwrap();
    drop(a);
    assert!(memory::memory_allocated(0).unwrap() < before);
    // the block belongs to s1's pool: the default stream gets another one
    let b = Tensor::zeros(&[n], DType::F32).cuda().unwrap();
    assert_ne!(b.data_ptr(), ptr);
    // once s2's work is done, s1 gets its block back
    s2.synchronize().unwrap();
    let c = on(&s1).unwrap().unwrap();
    assert_eq!(c.data_ptr(), ptr);
    // a stream of another device, or a CPU tensor, is refused
    let e = Tensor::ones(&[2], DType::F32)
        .record_stream(&s1)
        .unwrap_err()
        .to_string();
    assert!(e.contains("expected a CUDA tensor"), "{e}");
    drop((b, c));
    // the streams' blocks go back to the default stream when they are destroyed
    drop((s1, s2));
    memory::empty_cache(0).unwrap();
}

#[test]
fn gpu_outputs_folded_to_inputs_or_constants_are_fresh() {
    if !gpu_or_skip("gpu_outputs_folded_to_inputs_or_constants_are_fresh") {
        return;
    }
    let g = graph_of("one", "%x: f32[4]", "%y = mul(%x, 1.0)");
    let f = CudaFn::compile(&g, &Default::default()).unwrap();
    let x = Tensor::ones(&[4], DType::F32).cuda().unwrap();
    let y = f.call(std::slice::from_ref(&x)).unwrap();
    assert!(!y[0].shares_storage(&x));
    assert_eq!(y[0].cpu().unwrap().to_f64_vec(), vec![1.0; 4]);
    let g = graph_of(
        "k",
        "%x: f32[4]",
        "%z = zeros(size=[4])\n %y = add(%z, 2.0)",
    );
    let f = CudaFn::compile(&g, &Default::default()).unwrap();
    let a = f.call(std::slice::from_ref(&x)).unwrap();
    a[0].add_scalar_(1.0).unwrap();
    let b = f.call(std::slice::from_ref(&x)).unwrap();
    assert_eq!(b[0].cpu().unwrap().to_f64_vec(), vec![2.0; 4]);
}
