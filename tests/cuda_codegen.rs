//! CUDA C generation: the source of every op of ir-format.md version 1 and of the example
//! models, compiled with NVRTC to PTX and CUBIN for sm_90; plus the text of the generated
//! index arithmetic and row-kernel structure, which needs no NVRTC.
//!
//! Without NVRTC the compile tests print why and pass; with `SMELT_REQUIRE_NVRTC=1` (CI)
//! they fail instead.

mod common;

use common::cuda_cases::CASES;
use common::{smelt, temp_dir};
use smelt::codegen_cuda::nvrtc::{self, CompileOptions};
use smelt::codegen_cuda::{CudaOptions, CudaProgram, Launch, generate};
use smelt::ir::parse_module;
use smelt::kernel::Schedule;
use smelt::passes::fuse::compile;

/// The schedule of one case.
fn schedule(name: &str, params: &str, body: &str) -> Schedule {
    let text = format!("graph g_{name}({params}) {{\n {body}\n return %y\n}}\n");
    let m = parse_module(&text, name).unwrap_or_else(|e| panic!("{name}: {e}\n{text}"));
    compile(&m.graphs[0]).unwrap_or_else(|e| panic!("{name}: {e}"))
}

fn example_models() -> Vec<(String, Schedule)> {
    let mut out = Vec::new();
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
            out.push((g.name.clone(), compile(g).unwrap()));
        }
    }
    out
}

/// Every program: the op cases, then the example models.
fn programs() -> Vec<(String, CudaProgram)> {
    let mut out: Vec<(String, CudaProgram)> = CASES
        .iter()
        .map(|(n, p, b)| {
            let s = schedule(n, p, b);
            let prog =
                generate(&s, &CudaOptions::default()).unwrap_or_else(|e| panic!("{n}: {e}\n{s}"));
            (n.to_string(), prog)
        })
        .collect();
    for (n, s) in example_models() {
        let prog = generate(&s, &CudaOptions::default()).unwrap_or_else(|e| panic!("{n}: {e}"));
        out.push((format!("model {n}"), prog));
    }
    out
}

/// True when NVRTC is there; otherwise prints why the test does not compile anything, or
/// fails when the environment requires NVRTC.
fn nvrtc_or_skip(test: &str) -> bool {
    if nvrtc::is_available() {
        return true;
    }
    let why = match nvrtc::version() {
        Err(e) => e.to_string(),
        Ok(_) => "unknown".into(),
    };
    if std::env::var("SMELT_REQUIRE_NVRTC").as_deref() == Ok("1") {
        panic!("{test}: SMELT_REQUIRE_NVRTC=1 but NVRTC is missing: {why}");
    }
    eprintln!("{test}: skipped, NVRTC is not available: {why}");
    false
}

#[test]
fn every_op_generates_a_kernel() {
    for (name, prog) in programs() {
        let kernels = prog.kernels.len();
        let externs = prog.steps.len() - kernels;
        assert!(
            kernels + externs > 0,
            "{name}: nothing generated for a graph that computes something"
        );
        for k in &prog.kernels {
            assert!(
                k.source.contains(&format!(
                    "void __launch_bounds__({}) {}(",
                    k.launch.block(),
                    k.name
                )),
                "{name}:\n{}",
                k.source
            );
            assert_eq!(k.params.last().map(|p| p.name.as_str()), Some("sm_err"));
        }
    }
}

#[test]
fn every_op_compiles_to_ptx_and_cubin_for_sm_90() {
    if !nvrtc_or_skip("every_op_compiles_to_ptx_and_cubin_for_sm_90") {
        return;
    }
    let progs = programs();
    // one translation unit: the prelude once, every kernel after it
    let half = progs.iter().any(|(_, p)| p.uses_half());
    let mut src = CudaProgram::prelude(half);
    let mut names = Vec::new();
    for (_, p) in &progs {
        for k in &p.kernels {
            src.push('\n');
            src.push_str(&k.source);
            names.push(k.name.clone());
        }
    }
    let opts = CompileOptions::for_arch("sm_90");
    let out = match nvrtc::compile(&src, "all_ops.cu", &opts) {
        Ok(o) => o,
        Err(e) => panic!("{e}"),
    };
    assert!(
        out.log.is_empty() || !out.log.contains("error"),
        "{}",
        out.log
    );
    for n in &names {
        assert!(out.ptx.contains(&format!(".entry {n}(")), "PTX lacks {n}");
    }
    assert!(out.ptx.contains(".target sm_90"), "PTX target");
    // an ELF file for the GPU
    assert_eq!(&out.cubin[..4], b"\x7fELF");
    assert!(out.cubin.len() > 1000);
}

#[test]
fn contiguous_pointwise_kernels_move_16_bytes_per_access() {
    if !nvrtc_or_skip("contiguous_pointwise_kernels_move_16_bytes_per_access") {
        return;
    }
    let chain = "%r = relu(%x)\n %h = mul(%r, 0.5)\n %y = add(%h, %b)";
    let cases = [
        ("f32", "%x: f32[64,4097], %b: f32[4097]", "v4.f32"),
        ("f64", "%x: f64[64,4097], %b: f64[4097]", "v2.f64"),
        ("f16", "%x: f16[64,4097], %b: f16[4097]", "v4.u16"),
    ];
    for (name, params, vector) in cases {
        let p = generate(&schedule(name, params, chain), &CudaOptions::default()).unwrap();
        assert_eq!(p.kernels.len(), 1, "{name}: one fused kernel");
        let unit = p.unit(0).unwrap();
        let out = nvrtc::compile(&unit, "chain.cu", &CompileOptions::for_arch("sm_90"))
            .unwrap_or_else(|e| panic!("{name}: {e}"));
        // the contiguous input and the output move by vectors; the broadcast bias, the
        // tail and the misaligned fallback by elements
        assert!(
            out.ptx.contains(&format!("ld.global.nc.{vector}")),
            "{name}: vector load\n{}",
            out.ptx
        );
        assert!(
            out.ptx.contains(&format!("st.global.{vector}")),
            "{name}: vector store"
        );
        let scalar = vector.replace("v4.", "").replace("v2.", "");
        assert!(
            out.ptx.contains(&format!("st.global.{scalar}")),
            "{name}: scalar tail"
        );
    }
}

#[test]
fn runtime_copy_kernels_compile_for_sm_90() {
    if !nvrtc_or_skip("runtime_copy_kernels_compile_for_sm_90") {
        return;
    }
    let src = smelt::runtime::cuda::copy::SOURCE;
    let cubin = nvrtc::compile_cubin(src, "smelt_copy.cu", &CompileOptions::for_arch("sm_90"))
        .unwrap_or_else(|e| panic!("{e}"));
    assert_eq!(&cubin[..4], b"\x7fELF");
    let out = nvrtc::compile(src, "smelt_copy.cu", &CompileOptions::for_arch("sm_90")).unwrap();
    for n in [1, 2, 4, 8] {
        assert!(
            out.ptx.contains(&format!(".entry smelt_copy_{n}(")),
            "PTX lacks smelt_copy_{n}"
        );
    }
}

#[test]
fn each_kernel_is_a_compilable_unit_of_its_own() {
    if !nvrtc_or_skip("each_kernel_is_a_compilable_unit_of_its_own") {
        return;
    }
    // the models' units, as `smelt compile` writes them, each compiled alone
    let opts = CompileOptions::for_arch("sm_90");
    for (n, s) in example_models() {
        let p = generate(&s, &CudaOptions::default()).unwrap();
        for i in 0..p.kernels.len() {
            let unit = p.unit(i).unwrap();
            let out = nvrtc::compile(&unit, &format!("{n}_{i}.cu"), &opts)
                .unwrap_or_else(|e| panic!("{n}: {e}"));
            assert!(out.ptx.contains(&p.kernels[i].name));
        }
    }
}

#[test]
fn broken_source_fails_with_the_nvrtc_log() {
    if !nvrtc_or_skip("broken_source_fails_with_the_nvrtc_log") {
        return;
    }
    let src = "extern \"C\" __global__ void bad(float* x) { x[0] = undefined_name; }";
    let e = nvrtc::compile(src, "bad.cu", &CompileOptions::for_arch("sm_90")).unwrap_err();
    let msg = e.to_string();
    assert!(msg.contains("bad.cu"), "{msg}");
    assert!(msg.contains("undefined_name"), "{msg}");
}

#[test]
fn unknown_architecture_is_refused() {
    let e = nvrtc::compile("", "x.cu", &CompileOptions::for_arch("hopper")).unwrap_err();
    assert!(
        e.to_string().contains("unknown GPU architecture 'hopper'"),
        "{e}"
    );
}

#[test]
fn transposed_input_uses_div_mod_positions() {
    let s = schedule("tr", "%x: f32[5,3]", "%t = t(%x)\n %y = neg(%t)");
    let p = generate(&s, &CudaOptions::default()).unwrap();
    assert_eq!(p.kernels.len(), 1);
    let src = &p.kernels[0].source;
    // space [3,5]: i1 = flat % 5, i0 = flat / 5; x[i0, i1] of the transpose is x[i1*3 + i0]
    assert!(src.contains("const unsigned int i1 = sm_ri % 5;"), "{src}");
    assert!(src.contains("sm_ri /= 5;"), "{src}");
    assert!(src.contains("const unsigned int i0 = sm_ri;"), "{src}");
    assert!(src.contains("[i0 + 3*i1]"), "{src}");
    // the output is written in order: the flat index itself
    assert!(src.contains("[sm_i] = "), "{src}");
}

#[test]
fn broadcast_input_reads_only_the_dims_it_moves_along() {
    let s = schedule("bc", "%x: f32[4,7], %z: f32[4,1]", "%y = add(%x, %z)");
    let p = generate(&s, &CudaOptions::default()).unwrap();
    let src = &p.kernels[0].source;
    // z[i0] only: i1 is never computed
    assert!(src.contains("const unsigned int i0 = sm_ri;"), "{src}");
    assert!(!src.contains("i1 ="), "{src}");
    assert!(src.contains("[i0]"), "{src}");
    let Launch::Pointwise { n, block, grid } = p.kernels[0].launch else {
        panic!("not pointwise");
    };
    assert_eq!((n, block, grid), (28, 256, 1));
}

#[test]
fn softmax_is_one_row_kernel_with_two_passes() {
    let s = schedule("sm", "%x: f32[3,4097]", "%y = softmax(%x, dim=-1)");
    let p = generate(&s, &CudaOptions::default()).unwrap();
    assert_eq!(p.kernels.len(), 1);
    let k = &p.kernels[0];
    let src = &k.source;
    assert_eq!(src.matches("/* pass ").count(), 2, "{src}");
    assert!(src.contains("sm_block_reduce("), "{src}");
    assert!(src.contains("SmMax()"), "{src}");
    assert!(src.contains("SmSum()"), "{src}");
    assert!(
        src.contains("for (unsigned int sm_row = blockIdx.x;"),
        "{src}"
    );
    assert!(src.contains("sm_j += blockDim.x"), "{src}");
    assert_eq!(
        k.launch,
        Launch::Rows {
            per_thread: false,
            rows: 3,
            row_len: 4097,
            block: 256,
            grid: 3,
            shared_bytes: 512
        }
    );
}

#[test]
fn strided_rows_get_a_thread_each() {
    // sum over dim 0: each row (a column of x) is strided, consecutive rows adjacent
    let s = schedule("cols", "%x: f32[50,40]", "%y = sum(%x, dim=0)");
    let p = generate(&s, &CudaOptions::default()).unwrap();
    let k = &p.kernels[0];
    assert!(
        matches!(
            k.launch,
            Launch::Rows {
                per_thread: true,
                rows: 40,
                block: 256,
                grid: 1,
                ..
            }
        ),
        "{:?}",
        k.launch
    );
    assert!(
        k.source
            .contains("sm_row = (unsigned int)blockIdx.x * blockDim.x + threadIdx.x")
    );
    assert!(k.source.contains("++sm_j"));
    assert!(!k.source.contains("sm_block_reduce("));
    // contiguous rows keep a block each, and so do fewer rows than a warp
    for (shape, dim) in [("%x: f32[50,40]", 1), ("%x: f32[50,8]", 0)] {
        let s = schedule("rows", shape, &format!("%y = sum(%x, dim={dim})"));
        let p = generate(&s, &CudaOptions::default()).unwrap();
        assert!(
            matches!(
                p.kernels[0].launch,
                Launch::Rows {
                    per_thread: false,
                    ..
                }
            ),
            "{shape} dim {dim}"
        );
    }
}

#[test]
fn short_rows_get_one_warp() {
    let s = schedule("sh", "%x: f32[8,5]", "%y = sum(%x, dim=1)");
    let p = generate(&s, &CudaOptions::default()).unwrap();
    assert_eq!(p.kernels[0].launch.block(), 32);
    // the row store is done once, by thread 0
    assert!(p.kernels[0].source.contains("if (threadIdx.x == 0)"));
}

#[test]
fn half_kernels_compute_in_f32_and_include_the_headers() {
    let s = schedule("h", "%x: f16[7], %z: f16[7]", "%y = add(%x, %z)");
    let p = generate(&s, &CudaOptions::default()).unwrap();
    assert!(p.uses_half());
    let unit = p.unit(0).unwrap();
    assert!(unit.contains("#include <cuda_fp16.h>"));
    assert!(unit.contains("__half2float("));
    assert!(unit.contains("sm_rh("), "{unit}");
    assert!(unit.contains("__float2half_rn("));
    let s = schedule("f", "%x: f32[7]", "%y = exp(%x)");
    let p = generate(&s, &CudaOptions::default()).unwrap();
    assert!(!p.unit(0).unwrap().contains("cuda_fp16.h"));
    assert!(p.kernels[0].source.contains("expf("));
}

#[test]
fn integer_remainder_reports_division_by_zero_through_the_flag() {
    let s = schedule("r", "%x: i64[7], %z: i64[7]", "%y = remainder(%x, %z)");
    let p = generate(&s, &CudaOptions::default()).unwrap();
    assert!(
        p.kernels[0]
            .source
            .contains("sm_irem<long long>(v0, v1, sm_err)"),
        "{}",
        p.kernels[0].source
    );
    assert!(CudaProgram::prelude(false).contains("*err = 1u"));
}

/// `smelt compile MODEL --target cuda --arch sm_90` into `out`; its manifest.
fn compile_for_sm_90(model: &str, out: &std::path::Path) -> String {
    let o = smelt(&[
        "compile",
        model,
        "--target",
        "cuda",
        "--out",
        out.to_str().unwrap(),
        "--arch",
        "sm_90",
    ]);
    assert!(o.status.success(), "{}", String::from_utf8_lossy(&o.stderr));
    std::fs::read_to_string(out.join("manifest.json")).unwrap()
}

#[test]
fn smelt_compile_writes_sources_ptx_cubin_and_a_manifest() {
    if !nvrtc_or_skip("smelt_compile_writes_sources_ptx_cubin_and_a_manifest") {
        return;
    }
    // a directory the command makes
    let tmp = temp_dir("compile");
    let out = tmp.join("out");
    let model = concat!(
        env!("CARGO_MANIFEST_DIR"),
        "/examples/models/attention.smelt"
    );
    let m = compile_for_sm_90(model, &out);
    // the same kernels as generated here, each with its three files
    let text = std::fs::read_to_string(model).unwrap();
    let s = compile(&parse_module(&text, "a").unwrap().graphs[0]).unwrap();
    let p = generate(&s, &CudaOptions::default()).unwrap();
    assert!(!p.kernels.is_empty());
    for k in &p.kernels {
        let cu = std::fs::read_to_string(out.join(format!("{}.cu", k.name))).unwrap();
        assert!(cu.contains(&k.source));
        let ptx = std::fs::read_to_string(out.join(format!("{}.ptx", k.name))).unwrap();
        assert!(ptx.contains(&format!(".entry {}(", k.name)));
        let cubin = std::fs::read(out.join(format!("{}.cubin", k.name))).unwrap();
        assert_eq!(&cubin[..4], b"\x7fELF");
        assert!(m.contains(&format!("\"name\": \"{}\"", k.name)), "{m}");
        let launch = format!(
            "\"grid\": {}, \"block\": {}",
            k.launch.grid(),
            k.launch.block()
        );
        assert!(m.contains(&launch), "{m}");
    }
    // two GEMMs as extern calls; the transposed operand keeps its strides
    assert_eq!(m.matches("\"extern\": \"matmul\"").count(), 2, "{m}");
    assert!(
        m.contains("\"shape\": [2, 16, 8], \"strides\": [128, 1, 16]"),
        "{m}"
    );
    assert!(m.contains("\"bytes\": 1024"), "{m}");
    assert!(m.contains("\"arch\": \"sm_90\""), "{m}");
}

#[test]
fn smelt_compile_reports_bad_arguments() {
    // a directory that does not exist
    let tmp = temp_dir("bad");
    let out = tmp.join("out");
    let model = concat!(env!("CARGO_MANIFEST_DIR"), "/examples/models/softmax.smelt");
    let o = smelt(&[
        "compile",
        model,
        "--out",
        out.to_str().unwrap(),
        "--arch",
        "volta",
    ]);
    assert_eq!(o.status.code(), Some(1));
    let err = String::from_utf8_lossy(&o.stderr);
    assert!(err.starts_with("error: "), "{err}");
    assert!(
        err.contains("unknown GPU architecture 'volta'") || err.contains("NVRTC"),
        "{err}"
    );
    assert!(!err.contains("panicked"), "{err}");
    assert!(!out.exists(), "nothing is written on failure");
    let o = smelt(&[
        "compile",
        model,
        "--target",
        "tpu",
        "--out",
        out.to_str().unwrap(),
    ]);
    assert_eq!(o.status.code(), Some(2));
    let o = smelt(&[
        "compile",
        "/nonexistent.smelt",
        "--out",
        out.to_str().unwrap(),
    ]);
    assert_eq!(o.status.code(), Some(1));
}

#[test]
fn every_unary_op_has_a_case() {
    for u in smelt::ir::op::UnaryOp::ALL {
        let call = format!("= {}(", u.name());
        assert!(
            CASES.iter().any(|(_, _, body)| body.contains(&call)),
            "no CUDA case runs {}",
            u.name()
        );
    }
}

#[test]
fn smelt_compile_writes_attentions_gradient_as_kernels_and_gemms() {
    if !nvrtc_or_skip("smelt_compile_writes_attentions_gradient_as_kernels_and_gemms") {
        return;
    }
    // the fused CPU op has no CUDA kernel: its matmul-and-softmax form is compiled instead
    let dir = temp_dir("compile-attention-grad");
    let model = dir.join("ab.smelt");
    std::fs::write(
        &model,
        "graph ab(%g: f32[2,4,16,8], %q: f32[2,4,16,8], %k: f32[2,4,16,8], %v: f32[2,4,16,8]) {
  %r = scaled_dot_product_attention_backward(%g, %q, %k, %v, is_causal=true)
  return %r
}
",
    )
    .unwrap();
    let out = dir.join("out");
    let m = compile_for_sm_90(model.to_str().unwrap(), &out);
    assert!(!m.contains("scaled_dot_product_attention_backward"), "{m}");
    // scores, dP, dV, dQ and dK
    assert_eq!(m.matches("\"extern\": \"matmul\"").count(), 5, "{m}");
    // the softmax and the pointwise steps: generated kernels, compiled to PTX
    let ptx = std::fs::read_dir(&out)
        .unwrap()
        .filter(|e| {
            e.as_ref()
                .unwrap()
                .path()
                .extension()
                .is_some_and(|x| x == "ptx")
        })
        .count();
    assert!(ptx > 0, "{m}");
}
