//! `scaled_dot_product_attention` and `nn::MultiheadAttention` against float64 math written
//! out here (softmax(q kᵀ · scale + mask) v, row by row), over shapes that cross the
//! kernel's blocks of rows and keys, masks of every kind, causal rows, and the gradients.

mod common;

use common::close::{Tol, assert_close};
use smelt::autograd::gradcheck;
use smelt::exec::{CompileOptions, CompiledFn};
use smelt::ir::{parse_module, print_graph};
use smelt::nn::{Module, MultiheadAttention};
use smelt::profiler::{self, MemDevice, ProfilerOptions};
use smelt::{DType, Generator, Tensor};

/// The profiler records every thread: the tests of this file take turns, so that one test's
/// allocations never show in another's profile.
static TURN: std::sync::Mutex<()> = std::sync::Mutex::new(());

fn turn() -> std::sync::MutexGuard<'static, ()> {
    TURN.lock().unwrap_or_else(|e| e.into_inner())
}

/// What a mask does in the reference.
enum RefMask<'a> {
    None,
    Bool(&'a [bool]),
    Add(&'a [f64]),
}

/// Attention in f64 on dense row-major data: q [B, L, E], k [B, S, E], v [B, S, F];
/// the mask [B, L, S] (already broadcast). Fully masked rows give zeros.
#[allow(clippy::too_many_arguments)]
fn reference(
    q: &[f64],
    k: &[f64],
    v: &[f64],
    (b, l, s, e, f): (usize, usize, usize, usize, usize),
    mask: RefMask,
    causal: bool,
    scale: f64,
) -> Vec<f64> {
    let mut out = vec![0.0; b * l * f];
    for bi in 0..b {
        for i in 0..l {
            let mut sc = vec![f64::NEG_INFINITY; s];
            for (j, x) in sc.iter_mut().enumerate() {
                if causal && j > i {
                    continue;
                }
                let at = (bi * l + i) * s + j;
                if let RefMask::Bool(m) = mask
                    && !m[at]
                {
                    continue;
                }
                let mut d = 0.0;
                for t in 0..e {
                    d += q[(bi * l + i) * e + t] * k[(bi * s + j) * e + t];
                }
                *x = d * scale;
                if let RefMask::Add(m) = mask {
                    *x += m[at];
                }
            }
            let mx = sc.iter().cloned().fold(f64::NEG_INFINITY, f64::max);
            if mx == f64::NEG_INFINITY {
                continue;
            }
            let w: Vec<f64> = sc.iter().map(|&x| (x - mx).exp()).collect();
            let z: f64 = w.iter().sum();
            for c in 0..f {
                let mut acc = 0.0;
                for j in 0..s {
                    acc += w[j] * v[(bi * s + j) * f + c];
                }
                out[(bi * l + i) * f + c] = acc / z;
            }
        }
    }
    out
}

fn randn(shape: &[usize], dtype: DType, g: &mut Generator) -> Tensor {
    Tensor::randn_with(shape, Some(dtype), g).unwrap()
}

/// A mask's elements broadcast to `[batch.., l, s]`, flattened.
fn broadcast(m: &Tensor, full: &[usize]) -> Vec<f64> {
    let size: Vec<i64> = full.iter().map(|&d| d as i64).collect();
    m.expand(&size).unwrap().contiguous().unwrap().to_f64_vec()
}

#[test]
fn attention_matches_float64_math_over_blocks_masks_and_causal_rows() {
    let _t = turn();
    let mut g = Generator::new(1);
    // (batch dims, L, S, E, Ev): one block, many blocks of rows (16) and keys (128), L != S,
    // single rows and keys, wide values
    let cases: &[(&[usize], usize, usize, usize, usize)] = &[
        (&[2, 3], 5, 7, 8, 8),
        (&[1], 40, 300, 16, 4),
        (&[3], 1, 1, 3, 5),
        (&[2], 33, 17, 9, 20),
        (&[], 129, 129, 4, 4),
        // whole vectors of keys and values (register tiles in f32), three blocks of keys
        (&[2], 20, 264, 8, 16),
    ];
    for &(batch, l, s, e, f) in cases {
        let shape = |a: usize, c: usize| {
            let mut v = batch.to_vec();
            v.extend([a, c]);
            v
        };
        let bn: usize = batch.iter().product();
        let dims = (bn, l, s, e, f);
        for dtype in [DType::F64, DType::F32] {
            let q = randn(&shape(l, e), dtype, &mut g);
            let k = randn(&shape(s, e), dtype, &mut g);
            let v = randn(&shape(s, f), dtype, &mut g);
            let (qv, kv, vv) = (q.to_f64_vec(), k.to_f64_vec(), v.to_f64_vec());
            let tol = if dtype == DType::F64 {
                Tol::allclose(1e-12, 1e-12)
            } else {
                Tol::allclose(2e-6, 2e-6)
            };
            let scale = 1.0 / (e as f64).sqrt();
            for causal in [false, true] {
                let got = q
                    .scaled_dot_product_attention(&k, &v, None, causal, None)
                    .unwrap();
                assert_eq!(got.shape(), shape(l, f).as_slice());
                assert_eq!(got.dtype(), dtype);
                let want = reference(&qv, &kv, &vv, dims, RefMask::None, causal, scale);
                assert_close(&got.to_f64_vec(), &want, tol, "plain");
            }
            // a bool mask over [L, S], broadcast over the batch, some rows fully masked
            let mb: Vec<bool> = (0..l * s)
                .map(|i| (i * 7 + i / s) % 3 != 0 && i / s != 0)
                .collect();
            let mask = Tensor::from_vec(mb, &[l, s]).unwrap();
            let full = broadcast(&mask, &shape(l, s));
            let fb: Vec<bool> = full.iter().map(|&x| x != 0.0).collect();
            let got = q
                .scaled_dot_product_attention(&k, &v, Some(&mask), false, Some(0.3))
                .unwrap();
            let want = reference(&qv, &kv, &vv, dims, RefMask::Bool(&fb), false, 0.3);
            assert_close(&got.to_f64_vec(), &want, tol, "bool mask");
            // a float mask of the scores' full shape, with causal rows on top
            let add = randn(&shape(l, s), dtype, &mut g);
            let fa = add.to_f64_vec();
            let got = q
                .scaled_dot_product_attention(&k, &v, Some(&add), true, None)
                .unwrap();
            let want = reference(&qv, &kv, &vv, dims, RefMask::Add(&fa), true, scale);
            assert_close(&got.to_f64_vec(), &want, tol, "float mask, causal");
        }
    }
}

#[test]
fn heads_sliced_out_of_a_projection_are_read_in_place_with_the_same_bits() {
    let _t = turn();
    let mut g = Generator::new(4);
    // [B, T, 3, H, D] as a fused qkv projection gives it; q, k, v are its heads permuted
    // to [B, H, T, D] (rows strided, batches in two dims), over several key blocks; and a
    // view whose last dim is strided, which is copied
    for (b, t, h, d) in [(2, 33, 3, 8), (1, 200, 2, 5), (3, 1, 1, 4)] {
        for dtype in [DType::F32, DType::F64] {
            let qkv = randn(&[b, t, 3, h, d], dtype, &mut g);
            let head = |i: i64| qkv.select(2, i).unwrap().permute(&[0, 2, 1, 3]).unwrap();
            let (q, k, v) = (head(0), head(1), head(2));
            assert!(!q.is_contiguous());
            let dense = |x: &Tensor| x.contiguous().unwrap();
            for causal in [false, true] {
                let got = q
                    .scaled_dot_product_attention(&k, &v, None, causal, None)
                    .unwrap();
                let want = dense(&q)
                    .scaled_dot_product_attention(&dense(&k), &dense(&v), None, causal, None)
                    .unwrap();
                assert_eq!(
                    got.to_f64_vec(),
                    want.to_f64_vec(),
                    "{b}x{t}x{h}x{d} causal {causal}"
                );
                let (qv, kv, vv) = (
                    dense(&q).to_f64_vec(),
                    dense(&k).to_f64_vec(),
                    dense(&v).to_f64_vec(),
                );
                let scale = 1.0 / (d as f64).sqrt();
                let reference = reference(
                    &qv,
                    &kv,
                    &vv,
                    (b * h, t, t, d, d),
                    RefMask::None,
                    causal,
                    scale,
                );
                let tol = if dtype == DType::F64 {
                    Tol::allclose(1e-12, 1e-12)
                } else {
                    Tol::allclose(2e-6, 2e-6)
                };
                assert_close(&got.to_f64_vec(), &reference, tol, "strided heads");
            }
            // the last dim strided: the kernel copies it
            let kt = k
                .transpose(-1, -2)
                .unwrap()
                .contiguous()
                .unwrap()
                .transpose(-1, -2)
                .unwrap();
            assert!(t == 1 || kt.strides().last() != Some(&1));
            let got = q
                .scaled_dot_product_attention(&kt, &v, None, true, None)
                .unwrap();
            let want = q
                .scaled_dot_product_attention(&k, &v, None, true, None)
                .unwrap();
            assert_eq!(got.to_f64_vec(), want.to_f64_vec(), "strided last dim");
        }
    }
}

#[test]
fn masks_that_are_views_of_other_tensors_read_their_own_elements() {
    let _t = turn();
    let mut g = Generator::new(9);
    let q = randn(&[2, 3, 4], DType::F64, &mut g);
    let k = randn(&[2, 5, 4], DType::F64, &mut g);
    let v = randn(&[2, 5, 2], DType::F64, &mut g);
    // a slice that starts inside a larger tensor, and a transposed one
    let big = randn(&[4, 3, 5], DType::F64, &mut g);
    let sliced = big.narrow(0, 2, 2).unwrap();
    let t = randn(&[5, 3], DType::F64, &mut g).t().unwrap();
    for m in [sliced, t] {
        let got = q
            .scaled_dot_product_attention(&k, &v, Some(&m), false, None)
            .unwrap();
        let dense = m.contiguous().unwrap();
        let want = q
            .scaled_dot_product_attention(&k, &v, Some(&dense), false, None)
            .unwrap();
        let full = broadcast(&dense, &[2, 3, 5]);
        let r = reference(
            &q.to_f64_vec(),
            &k.to_f64_vec(),
            &v.to_f64_vec(),
            (2, 3, 5, 4, 2),
            RefMask::Add(&full),
            false,
            0.5,
        );
        assert_close(
            &got.to_f64_vec(),
            &r,
            Tol::allclose(1e-12, 1e-12),
            "view mask",
        );
        assert_close(&got, &want, Tol::EXACT, "view mask against its copy");
    }
}

#[test]
fn half_inputs_compute_in_float32_and_round_once() {
    let _t = turn();
    let mut g = Generator::new(2);
    let q = randn(&[2, 6, 8], DType::F32, &mut g);
    let k = randn(&[2, 10, 8], DType::F32, &mut g);
    let v = randn(&[2, 10, 8], DType::F32, &mut g);
    for d in [DType::F16, DType::BF16] {
        let h = |t: &Tensor| t.to_dtype(d).unwrap();
        let got = h(&q)
            .scaled_dot_product_attention(&h(&k), &h(&v), None, true, None)
            .unwrap();
        assert_eq!(got.dtype(), d);
        let f = |t: &Tensor| h(t).to_dtype(DType::F32).unwrap();
        let want = f(&q)
            .scaled_dot_product_attention(&f(&k), &f(&v), None, true, None)
            .unwrap()
            .to_dtype(d)
            .unwrap();
        assert_close(&got.to_f64_vec(), &want.to_f64_vec(), Tol::EXACT, "halves");
    }
}

#[test]
fn bad_operands_are_errors_with_pytorchs_messages() {
    let _t = turn();
    let q = Tensor::zeros(&[2, 4, 8], DType::F32);
    let k = Tensor::zeros(&[2, 5, 8], DType::F32);
    let v = Tensor::zeros(&[2, 5, 3], DType::F32);
    let err = |r: smelt::Result<Tensor>| r.unwrap_err().to_string();
    let e = err(q.scaled_dot_product_attention(
        &k.to_dtype(DType::F64).unwrap(),
        &v,
        None,
        false,
        None,
    ));
    assert!(
        e.contains("Expected query, key, and value to have the same dtype"),
        "{e}"
    );
    let e = err(q.scaled_dot_product_attention(
        &Tensor::zeros(&[2, 5, 7], DType::F32),
        &v,
        None,
        false,
        None,
    ));
    assert!(e.contains("key must be"), "{e}");
    let e = err(q.scaled_dot_product_attention(
        &k,
        &Tensor::zeros(&[2, 6, 3], DType::F32),
        None,
        false,
        None,
    ));
    assert!(e.contains("value"), "{e}");
    let e = err(q.scaled_dot_product_attention(
        &k,
        &v,
        Some(&Tensor::zeros(&[4, 6], DType::Bool)),
        false,
        None,
    ));
    assert!(e.contains("does not broadcast"), "{e}");
    let e = err(q.scaled_dot_product_attention(
        &k,
        &v,
        Some(&Tensor::zeros(&[4, 5], DType::I64)),
        false,
        None,
    ));
    assert!(e.contains("attn_mask dtype"), "{e}");
    let qi = Tensor::zeros(&[2, 4, 8], DType::I64);
    assert!(
        qi.scaled_dot_product_attention(&qi, &qi, None, false, None)
            .is_err()
    );
}

#[test]
fn the_op_reads_and_prints_and_compiles_to_one_library_call() {
    let _t = turn();
    let text =
        "graph attn(%q: f32[2,4,64,16], %k: f32[2,4,64,16], %v: f32[2,4,64,16], %m: bool[64,64]) {
  %a: f32[2,4,64,16] = scaled_dot_product_attention(%q, %k, %v, is_causal=true)
  %b: f32[2,4,64,16] = scaled_dot_product_attention(%q, %k, %v, %m, scale=0.25)
  %c: f32[2,4,64,16] = add(%a, %b)
  return %c
}
";
    let m = parse_module(text, "attn").unwrap();
    let g = &m.graphs[0];
    assert_eq!(print_graph(g), text);
    let f = CompiledFn::compile(g, &CompileOptions::default()).unwrap();
    let steps: Vec<&str> = f.steps().iter().map(|s| s.name.as_str()).collect();
    assert_eq!(
        steps
            .iter()
            .filter(|n| **n == "extern_scaled_dot_product_attention")
            .count(),
        2,
        "{steps:?}"
    );
    // no buffer as large as the scores: memory linear in the sequence length
    let scores = 2 * 4 * 64 * 64;
    assert!(f.schedule().buffers.iter().all(|b| b.len() < scores));
    let mut rng = Generator::new(3);
    let mut ins: Vec<Tensor> = (0..3)
        .map(|_| randn(&[2, 4, 64, 16], DType::F32, &mut rng))
        .collect();
    let keep = Tensor::rand_with(&[64, 64], None, &mut rng).unwrap();
    ins.push(keep.gt_scalar(0.3).unwrap());
    let got = f.call(&ins).unwrap();
    let a = ins[0]
        .scaled_dot_product_attention(&ins[1], &ins[2], None, true, None)
        .unwrap();
    let b = ins[0]
        .scaled_dot_product_attention(&ins[1], &ins[2], Some(&ins[3]), false, Some(0.25))
        .unwrap();
    assert_close(
        &got[0],
        &a.add(&b).unwrap(),
        Tol::allclose(1e-6, 1e-6),
        "compiled",
    );
    let bad = text.replace("scale=0.25", "dropout_p=0.1");
    let e = parse_module(&bad, "bad.smelt").unwrap_err().to_string();
    assert!(e.contains("dropout_p") && e.contains("bad.smelt:3"), "{e}");
}

#[test]
fn gradients_pass_gradcheck_with_masks_and_causal_rows() {
    let _t = turn();
    let mut g = Generator::new(4);
    let q = randn(&[2, 5, 3], DType::F64, &mut g);
    let k = randn(&[2, 6, 3], DType::F64, &mut g);
    let v = randn(&[2, 6, 4], DType::F64, &mut g);
    let add = randn(&[5, 6], DType::F64, &mut g);
    let keep =
        Tensor::from_vec((0..30).map(|i| i % 4 != 1).collect::<Vec<bool>>(), &[5, 6]).unwrap();
    for t in [&q, &k, &v, &add] {
        t.requires_grad_(true).unwrap();
    }
    let r = gradcheck(
        |xs: &[Tensor]| {
            xs[0].scaled_dot_product_attention(&xs[1], &xs[2], Some(&xs[3]), true, None)
        },
        &[q.clone(), k.clone(), v.clone(), add.clone()],
    );
    assert!(r.is_ok(), "{r:?}");
    let r = gradcheck(
        |xs: &[Tensor]| {
            xs[0].scaled_dot_product_attention(&xs[1], &xs[2], Some(&keep), false, Some(0.7))
        },
        &[q.clone(), k.clone(), v.clone()],
    );
    assert!(r.is_ok(), "{r:?}");
}

#[test]
fn doubling_the_context_doubles_attentions_memory() {
    let _t = turn();
    // what the forward allocates, recorded by the profiler: linear in T, not quadratic
    let peak = |t: usize| {
        let mut g = Generator::new(5);
        let q = randn(&[1, 2, t, 32], DType::F32, &mut g);
        let ((), prof) = profiler::profile(ProfilerOptions::default().profile_memory(true), || {
            let o = q
                .scaled_dot_product_attention(&q, &q, None, true, None)
                .unwrap();
            drop(o);
        })
        .unwrap();
        prof.peak_memory(MemDevice::Cpu)
    };
    let (a, b) = (peak(512), peak(1024));
    assert!(a > 0 && b <= 2 * a + 4096, "{a} then {b}");
    // the scores alone would be 4·2·T² bytes
    assert!(b < 4 * 2 * 1024 * 1024, "{b}");
}

#[test]
fn multihead_attention_matches_its_formula_and_trains() {
    let _t = turn();
    let mut mha = MultiheadAttention::new(16, 4).unwrap().causal(true);
    let names: Vec<String> = mha.named_parameters().into_iter().map(|(n, _)| n).collect();
    assert_eq!(
        names,
        [
            "in_proj_weight",
            "in_proj_bias",
            "out_proj.weight",
            "out_proj.bias"
        ]
    );
    let mut g = Generator::new(6);
    let x = randn(&[2, 7, 16], DType::F32, &mut g);
    let y = mha.forward(&x).unwrap();
    assert_eq!(y.shape(), &[2, 7, 16]);
    // by hand: project, split heads, causal softmax per head, merge, project
    let w = mha.in_proj_weight.to_f64_vec();
    let xb = x.to_f64_vec();
    let proj = |part: usize| -> Vec<f64> {
        let mut o = vec![0.0; 2 * 7 * 16];
        for r in 0..14 {
            for c in 0..16 {
                let mut s = 0.0;
                for t in 0..16 {
                    s += xb[r * 16 + t] * w[(part * 16 + c) * 16 + t];
                }
                o[r * 16 + c] = s; // the biases start at zero
            }
        }
        o
    };
    let (pq, pk, pv) = (proj(0), proj(1), proj(2));
    // [B, T, H, D] → [B·H, T, D]
    let split = |p: &[f64]| -> Vec<f64> {
        let mut o = vec![0.0; p.len()];
        for b in 0..2 {
            for t in 0..7 {
                for h in 0..4 {
                    for d in 0..4 {
                        o[((b * 4 + h) * 7 + t) * 4 + d] = p[(b * 7 + t) * 16 + h * 4 + d];
                    }
                }
            }
        }
        o
    };
    let att = reference(
        &split(&pq),
        &split(&pk),
        &split(&pv),
        (8, 7, 7, 4, 4),
        RefMask::None,
        true,
        0.5,
    );
    let mut merged = vec![0.0; 2 * 7 * 16];
    for b in 0..2 {
        for h in 0..4 {
            for t in 0..7 {
                for d in 0..4 {
                    merged[(b * 7 + t) * 16 + h * 4 + d] = att[((b * 4 + h) * 7 + t) * 4 + d];
                }
            }
        }
    }
    let want = Tensor::from_vec(merged, &[2, 7, 16])
        .unwrap()
        .to_dtype(DType::F32)
        .unwrap()
        .linear(&mha.out_proj.weight, mha.out_proj.bias.as_ref())
        .unwrap();
    assert_close(&y, &want, Tol::allclose(1e-5, 1e-5), "multihead");
    // gradients reach every parameter; a few steps of SGD lower a loss
    let target = randn(&[2, 7, 16], DType::F32, &mut g);
    let loss = |m: &MultiheadAttention| {
        m.forward(&x)
            .unwrap()
            .sub(&target)
            .unwrap()
            .square()
            .unwrap()
            .mean()
            .unwrap()
    };
    let first = loss(&mha).item_f64().unwrap();
    let mut opt =
        smelt::optim::SGD::new(mha.parameters(), smelt::optim::SGDConfig::new(0.5)).unwrap();
    use smelt::optim::Optimizer;
    for _ in 0..20 {
        opt.zero_grad();
        loss(&mha).backward().unwrap();
        for p in mha.parameters() {
            assert!(p.grad().is_some());
        }
        opt.step().unwrap();
    }
    assert!(loss(&mha).item_f64().unwrap() < 0.8 * first);
    mha.eval();
    assert!(!mha.is_training() && !mha.out_proj.is_training());
}

#[test]
fn the_profiler_counts_attentions_arithmetic() {
    let _t = turn();
    let q = Tensor::zeros(&[2, 5, 4], DType::F32);
    let k = Tensor::zeros(&[2, 7, 4], DType::F32);
    let v = Tensor::zeros(&[2, 7, 3], DType::F32);
    let ((), prof) = profiler::profile(ProfilerOptions::default(), || {
        let _ = q
            .scaled_dot_product_attention(&k, &v, None, false, None)
            .unwrap();
    })
    .unwrap();
    let e = &prof.events[0];
    assert_eq!(e.name, "scaled_dot_product_attention");
    // scores: 2·L·S·E per batch, weighted values: 2·L·S·Ev
    assert_eq!(e.flops, 2 * 2 * 5 * 7 * (4 + 3));
}

/// The gradients of `sum(o ∘ w)` for `o` = attention, in f64 on dense row-major data (the
/// shapes and mask as [`reference`]'s): `P` per row, then `dV = Pᵀw`, `dP = w Vᵀ`,
/// `dS = P ∘ (dP − rowsum(P ∘ dP))`, `dQ = scale·dS K`, `dK = scale·dSᵀ Q`.
#[allow(clippy::too_many_arguments)]
fn reference_grads(
    q: &[f64],
    k: &[f64],
    v: &[f64],
    w: &[f64],
    (b, l, s, e, f): (usize, usize, usize, usize, usize),
    mask: RefMask,
    causal: bool,
    scale: f64,
) -> [Vec<f64>; 3] {
    let (mut dq, mut dk, mut dv) = (
        vec![0.0; b * l * e],
        vec![0.0; b * s * e],
        vec![0.0; b * s * f],
    );
    for bi in 0..b {
        for i in 0..l {
            let mut sc = vec![f64::NEG_INFINITY; s];
            for (j, x) in sc.iter_mut().enumerate() {
                let at = (bi * l + i) * s + j;
                let hidden = (causal && j > i) || matches!(mask, RefMask::Bool(m) if !m[at]);
                if hidden {
                    continue;
                }
                let d: f64 = (0..e)
                    .map(|t| q[(bi * l + i) * e + t] * k[(bi * s + j) * e + t])
                    .sum();
                *x = d * scale
                    + if let RefMask::Add(m) = mask {
                        m[at]
                    } else {
                        0.0
                    };
            }
            let mx = sc.iter().cloned().fold(f64::NEG_INFINITY, f64::max);
            if mx == f64::NEG_INFINITY {
                continue;
            }
            let ex: Vec<f64> = sc.iter().map(|&x| (x - mx).exp()).collect();
            let z: f64 = ex.iter().sum();
            let p: Vec<f64> = ex.iter().map(|x| x / z).collect();
            let wi = &w[(bi * l + i) * f..(bi * l + i + 1) * f];
            let dp: Vec<f64> = (0..s)
                .map(|j| (0..f).map(|c| wi[c] * v[(bi * s + j) * f + c]).sum())
                .collect();
            let dot: f64 = p.iter().zip(&dp).map(|(a, b)| a * b).sum();
            for j in 0..s {
                let ds = p[j] * (dp[j] - dot) * scale;
                for c in 0..f {
                    dv[(bi * s + j) * f + c] += p[j] * wi[c];
                }
                for t in 0..e {
                    dq[(bi * l + i) * e + t] += ds * k[(bi * s + j) * e + t];
                    dk[(bi * s + j) * e + t] += ds * q[(bi * l + i) * e + t];
                }
            }
        }
    }
    [dq, dk, dv]
}

/// Runs `f` with the profiler on, and the names of the eager ops it ran.
fn ops_run(f: impl FnOnce()) -> Vec<String> {
    let ((), prof) = profiler::profile(ProfilerOptions::default(), f).unwrap();
    prof.events().iter().map(|e| e.name.clone()).collect()
}

/// A mask's kind in [`BackwardCase`].
#[derive(Clone, Copy, PartialEq)]
enum MaskKind {
    None,
    Bool,
    Add,
}

/// One attention whose gradients are checked.
struct BackwardCase {
    batch: &'static [usize],
    /// L, S, E, Ev.
    sizes: (usize, usize, usize, usize),
    causal: bool,
    mask: MaskKind,
    scale: Option<f64>,
    /// q, k and v read through the strides of a transpose.
    strided: bool,
}

#[test]
fn the_backward_is_one_op_that_matches_float64_math() {
    let _t = turn();
    let mut rng = Generator::new(11);
    // two blocks of query rows, L != S, E != Ev, broadcast masks with fully hidden rows,
    // operands read through strides
    let case = |batch, sizes, causal, mask, scale, strided| BackwardCase {
        batch,
        sizes,
        causal,
        mask,
        scale,
        strided,
    };
    let cases = [
        case(&[2, 3], (70, 75, 4, 5), true, MaskKind::None, None, false),
        case(
            &[1, 3],
            (9, 130, 3, 2),
            false,
            MaskKind::Bool,
            Some(0.7),
            false,
        ),
        case(&[2], (5, 6, 3, 4), true, MaskKind::Add, None, false),
        case(&[3], (1, 1, 2, 2), false, MaskKind::None, None, false),
        case(
            &[2, 2],
            (66, 66, 8, 8),
            true,
            MaskKind::Bool,
            Some(0.3),
            true,
        ),
        // key counts and head widths that are whole vectors (products on register tiles
        // in f32)
        case(&[2, 2], (32, 32, 24, 24), true, MaskKind::None, None, false),
        case(&[3], (40, 48, 16, 8), false, MaskKind::Add, None, false),
        case(
            &[2],
            (70, 72, 8, 16),
            false,
            MaskKind::Bool,
            Some(0.4),
            true,
        ),
    ];
    for (ci, c) in cases.iter().enumerate() {
        for dtype in [DType::F64, DType::F32] {
            check_backward(ci, c, dtype, &mut rng);
        }
    }
}

/// The gradients of `sum(attention ∘ w)` by one fused op, against float64 math on the
/// same (rounded) inputs.
fn check_backward(ci: usize, c: &BackwardCase, dtype: DType, rng: &mut Generator) {
    {
        let (l, s, e, f) = c.sizes;
        let shape = |rows: usize, cols: usize| [c.batch, &[rows, cols]].concat();
        let make = |rows: usize, cols: usize, rng: &mut Generator| {
            if c.strided {
                // [.., rows, cols] read through the strides of a [.., cols, rows] transpose
                let n = shape(cols, rows);
                let d = n.len() as i64;
                randn(&n, dtype, rng).transpose(d - 2, d - 1).unwrap()
            } else {
                randn(&shape(rows, cols), dtype, rng)
            }
        };
        let (q, k, v) = (make(l, e, rng), make(s, e, rng), make(s, f, rng));
        let w = randn(&shape(l, f), dtype, rng);
        let keep: Vec<bool> = (0..l * s).map(|i| i % 5 != 2 && i / s != 1).collect();
        let mask = match c.mask {
            MaskKind::Bool => Some(Tensor::from_vec(keep, &[l, s]).unwrap()),
            MaskKind::Add => Some(randn(&[l, s], dtype, rng)),
            MaskKind::None => None,
        };
        for t in [&q, &k, &v] {
            t.requires_grad_(true).unwrap();
        }
        let names = ops_run(|| {
            let o = q
                .scaled_dot_product_attention(&k, &v, mask.as_ref(), c.causal, c.scale)
                .unwrap();
            o.mul(&w).unwrap().sum().unwrap().backward().unwrap();
        });
        // one op computes the three gradients; no softmax or matmul of the scores
        let fused = names
            .iter()
            .filter(|n| *n == "scaled_dot_product_attention_backward")
            .count();
        assert_eq!(fused, 1, "case {ci}: {names:?}");
        assert!(
            !names.iter().any(|n| n == "softmax" || n == "matmul"),
            "case {ci}: {names:?}"
        );
        let flat = |t: &Tensor| t.contiguous().unwrap().to_f64_vec();
        let mvals = mask.as_ref().map(|m| broadcast(m, &shape(l, s)));
        let bools: Vec<bool> = mvals.iter().flatten().map(|&x| x != 0.0).collect();
        let rmask = match (&mvals, c.mask) {
            (Some(_), MaskKind::Bool) => RefMask::Bool(&bools),
            (Some(m), _) => RefMask::Add(m),
            (None, _) => RefMask::None,
        };
        let want = reference_grads(
            &flat(&q),
            &flat(&k),
            &flat(&v),
            &flat(&w),
            (c.batch.iter().product(), l, s, e, f),
            rmask,
            c.causal,
            c.scale.unwrap_or(1.0 / (e as f64).sqrt()),
        );
        for (name, t, want) in [
            ("q", &q, &want[0]),
            ("k", &k, &want[1]),
            ("v", &v, &want[2]),
        ] {
            let want = Tensor::from_vec(want.clone(), t.shape()).unwrap();
            let tol = if dtype == DType::F64 {
                Tol::allclose(1e-12, 1e-12)
            } else {
                Tol::allclose(2e-5, 2e-5)
            };
            assert_close(
                &t.grad().unwrap().to_dtype(DType::F64).unwrap(),
                &want,
                tol,
                &format!("case {ci} {dtype:?}: grad of {name}"),
            );
        }
    }
}

#[test]
fn the_fused_backward_and_its_matmul_form_agree_compiled_and_interpreted() {
    let _t = turn();
    // the op as written in a graph; its matmul-and-softmax form is what the CUDA code
    // generator compiles
    let text = "graph ab(%g: f32[2,3,70,5], %q: f32[2,3,70,4], %k: f32[2,3,75,4], %v: f32[2,3,75,5], %m: bool[70,75]) {
  %a: f32[5730] = scaled_dot_product_attention_backward(%g, %q, %k, %v, is_causal=true)
  %b: f32[5730] = scaled_dot_product_attention_backward(%g, %q, %k, %v, %m, scale=0.5)
  return %a, %b
}
";
    let m = parse_module(text, "ab").unwrap();
    let g = &m.graphs[0];
    assert_eq!(print_graph(g), text);
    let expanded = smelt::passes::decompose::expand_attention_grads(g).unwrap();
    let mut rng = Generator::new(12);
    let mut ins: Vec<Tensor> = [[2, 3, 70, 5], [2, 3, 70, 4], [2, 3, 75, 4], [2, 3, 75, 5]]
        .iter()
        .map(|s| randn(s, DType::F32, &mut rng))
        .collect();
    let keep = Tensor::rand_with(&[70, 75], None, &mut rng).unwrap();
    ins.push(keep.gt_scalar(0.2).unwrap());
    let fused = smelt::runtime::interp::run_positional(g, &ins).unwrap();
    let primitives = smelt::runtime::interp::run_positional(&expanded, &ins).unwrap();
    let f = CompiledFn::compile(g, &CompileOptions::default()).unwrap();
    let steps: Vec<&str> = f.steps().iter().map(|s| s.name.as_str()).collect();
    assert_eq!(
        steps
            .iter()
            .filter(|n| **n == "extern_scaled_dot_product_attention_backward")
            .count(),
        2,
        "{steps:?}"
    );
    let compiled = f.call(&ins).unwrap();
    for i in 0..2 {
        assert_close(
            &fused[i],
            &primitives[i],
            Tol::allclose(2e-5, 2e-5),
            "fused vs matmul form",
        );
        assert_close(
            &compiled[i],
            &fused[i],
            Tol::allclose(0.0, 0.0),
            "compiled vs eager",
        );
    }
    // the matmul form materialises the scores; the fused op does not
    let scores = 2 * 3 * 70 * 75;
    assert!(f.schedule().buffers.iter().all(|b| b.len() < scores));
    // a wrong gradient shape is an error naming the op
    let bad = text.replace("%g: f32[2,3,70,5]", "%g: f32[2,3,70,4]");
    let e = parse_module(&bad, "bad.smelt").unwrap_err().to_string();
    assert!(e.contains("scaled_dot_product_attention_backward"), "{e}");
}

#[test]
fn a_training_step_of_attention_keeps_memory_linear_in_the_context() {
    let _t = turn();
    // forward and backward, recorded by the profiler: the scores [T, T] never exist
    let peak = |t: usize| {
        let mut g = Generator::new(13);
        let q = randn(&[1, 2, t, 32], DType::F32, &mut g);
        q.requires_grad_(true).unwrap();
        let ((), prof) = profiler::profile(ProfilerOptions::default().profile_memory(true), || {
            let o = q
                .scaled_dot_product_attention(&q, &q, None, true, None)
                .unwrap();
            o.sum().unwrap().backward().unwrap();
        })
        .unwrap();
        assert!(q.grad().is_some());
        prof.peak_memory(MemDevice::Cpu)
    };
    let (a, b) = (peak(512), peak(1024));
    assert!(a > 0 && b <= 2 * a + 4096, "{a} then {b}");
    // the scores alone would be 4·2·T² bytes
    assert!(b < 4 * 2 * 1024 * 1024, "{b}");
}
