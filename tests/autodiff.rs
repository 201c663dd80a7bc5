//! The autodiff pass: gradient graphs against hand-computed gradients and against eager
//! backward, its error cases, and `smelt grad` through the built binary.

mod common;

use common::{Tol, assert_close, smelt_in, temp_dir};
use smelt::ir::graph::GraphBuilder;
use smelt::ir::op::{BinaryOp, Op};
use smelt::ir::parse_module;
use smelt::passes::autodiff::{Seed, autodiff, autodiff_with};
use smelt::runtime::interp;
use smelt::runtime::npy::{read_npy, write_npy};
use smelt::{DType, Tensor};

#[test]
fn seeds_square_plus_linear_graph() {
    let mut b = GraphBuilder::new("f");
    let x = b.input("x", DType::F32, &[]).unwrap();
    let sq = b.binary_scalar(BinaryOp::Pow, x, 2).unwrap();
    let tx = b.mul_scalar(x, 3).unwrap();
    let y = b.add(sq, tx).unwrap();
    let g = b.finish(&[y]).unwrap();
    let gg = autodiff(&g, &["x"]).unwrap();
    let names: Vec<&str> = gg
        .outputs()
        .iter()
        .map(|&v| gg.node(v).name.as_str())
        .collect();
    assert_eq!(names.last(), Some(&"grad_x"));
    let out = interp::run(&gg, &[("x", Tensor::scalar(2.0))]).unwrap();
    assert_eq!(out[0].item_f64().unwrap(), 10.0);
    assert_eq!(out[1].item_f64().unwrap(), 7.0);
    // The printed gradient graph parses back to the same graph.
    let text = smelt::ir::print_graph(&gg);
    let back = parse_module(&text, "grad").unwrap();
    assert_eq!(back.entry(), &gg);
}

const MODELS: &str = "\
graph mlp(%x: f64[4,3], %w1: f64[5,3], %b1: f64[5], %w2: f64[2,5]) {
  %h = linear(%x, %w1, %b1)
  %a = gelu(%h)
  %s = softmax(%a, dim=1)
  %y = linear(%s, %w2)
  %l = layer_norm(%y, normalized_shape=[2], eps=1e-5)
  %t = tanh(%l)
  return %t, %h
}
";

fn det(shape: &[usize], seed: u64) -> Tensor {
    let n: usize = shape.iter().product();
    let v: Vec<f64> = (0..n)
        .map(|i| (((i as u64 * 37 + seed * 11) % 23) as f64) / 23.0 - 0.45)
        .collect();
    Tensor::from_vec(v, shape).unwrap()
}

#[test]
fn graph_gradients_agree_with_eager_backward() {
    let m = parse_module(MODELS, "m").unwrap();
    let g = m.entry();
    let names = ["x", "w1", "b1", "w2"];
    let shapes: [&[usize]; 4] = [&[4, 3], &[5, 3], &[5], &[2, 5]];
    let inputs: Vec<(&str, Tensor)> = names
        .iter()
        .zip(shapes)
        .enumerate()
        .map(|(i, (n, s))| (*n, det(s, i as u64)))
        .collect();
    let gg = autodiff(g, &names).unwrap();
    let out = interp::run(&gg, &inputs).unwrap();
    // Eager: the same graph run on leaves that require grad, then backward of the sum.
    let leaves: Vec<(&str, Tensor)> = inputs
        .iter()
        .map(|(n, t)| {
            let l = t.detach();
            l.requires_grad_(true).unwrap();
            (*n, l)
        })
        .collect();
    let eo = interp::run(g, &leaves).unwrap();
    let total = eo[0].sum().unwrap().add(&eo[1].sum().unwrap()).unwrap();
    total.backward().unwrap();
    for (i, (_, l)) in leaves.iter().enumerate() {
        assert_close(
            &out[2 + i].to_f64_vec(),
            &l.grad().unwrap().to_f64_vec(),
            Tol::allclose(1e-10, 1e-10),
            &format!("gradient of leaf {i}"),
        );
    }
}

#[test]
fn seed_inputs_take_upstream_gradients() {
    let mut b = GraphBuilder::new("f");
    let x = b.input("x", DType::F32, &[3]).unwrap();
    let y = b.mul(x, x).unwrap();
    let g = b.finish(&[y]).unwrap();
    let gg = autodiff_with(&g, &["x"], Seed::Inputs).unwrap();
    let xv = Tensor::from_slice(&[1.0f32, 2.0, 3.0], &[3]).unwrap();
    let up = Tensor::from_slice(&[1.0f32, 0.5, -1.0], &[3]).unwrap();
    let out = interp::run(&gg, &[("x", xv), ("grad_out0", up)]).unwrap();
    assert_eq!(out[1].to_f64_vec(), vec![2.0, 2.0, -6.0]);
}

#[test]
fn ties_split_evenly_like_pytorch() {
    let m = parse_module(
        "graph t(%a: f32[3], %b: f32[3]) {\n  %m = maximum(%a, %b)\n  %x = amax(%a)\n  return %m, %x\n}\n",
        "t",
    )
    .unwrap();
    let gg = autodiff(m.entry(), &["a", "b"]).unwrap();
    let a = Tensor::from_slice(&[1.0f32, 5.0, 5.0], &[3]).unwrap();
    let b = Tensor::from_slice(&[1.0f32, 0.0, 7.0], &[3]).unwrap();
    let out = interp::run(&gg, &[("a", a), ("b", b)]).unwrap();
    // maximum: tie at 0 splits 0.5/0.5; amax: the two 5s share 1.
    assert_eq!(out[2].to_f64_vec(), vec![0.5, 1.5, 0.5]);
    assert_eq!(out[3].to_f64_vec(), vec![0.5, 0.0, 1.0]);
}

#[test]
fn clamp_passes_gradient_on_the_bounds() {
    let m = parse_module(
        "graph c(%x: f32[4]) {\n  %y = clamp(%x, min=0.0, max=1.0)\n  return %y\n}\n",
        "c",
    )
    .unwrap();
    let gg = autodiff(m.entry(), &["x"]).unwrap();
    let x = Tensor::from_slice(&[-1.0f32, 0.0, 1.0, 2.0], &[4]).unwrap();
    let out = interp::run(&gg, &[("x", x)]).unwrap();
    assert_eq!(out[1].to_f64_vec(), vec![0.0, 1.0, 1.0, 0.0]);
}

#[test]
fn errors_name_the_problem() {
    let m = parse_module(
        "graph e(%x: f32[3], %i: i64[3], %u: f32[3]) {\n  %a = argmax(%x)\n  %y = to(%a, dtype=f32)\n  return %y\n}\n",
        "e",
    )
    .unwrap();
    let g = m.entry();
    let e = autodiff(g, &["x"]).unwrap_err().to_string();
    assert!(e.contains("argmax") && e.contains("no gradient"), "{e}");
    let e = autodiff(g, &["i"]).unwrap_err().to_string();
    assert!(e.contains("only floating-point inputs"), "{e}");
    let e = autodiff(g, &["nope"]).unwrap_err().to_string();
    assert!(e.contains("no input named 'nope'"), "{e}");
    // An input the outputs do not use has a zero gradient.
    let gg = autodiff(g, &["u"]).unwrap();
    let out = interp::run(
        &gg,
        &[
            ("x", Tensor::zeros(&[3], DType::F32)),
            ("i", Tensor::zeros(&[3], DType::I64)),
            ("u", Tensor::ones(&[3], DType::F32)),
        ],
    )
    .unwrap();
    assert_eq!(out[1].to_f64_vec(), vec![0.0; 3]);
}

#[test]
fn gradient_graph_keeps_forward_value_ids() {
    // Eager autograd feeds kept values by ValueId: the pass must not renumber them.
    let m = parse_module(MODELS, "m").unwrap();
    let g = m.entry();
    let gg = autodiff(g, &["x"]).unwrap();
    for v in g.topo_order() {
        assert_eq!(g.node(v), gg.node(v));
    }
    let n = gg
        .topo_order()
        .into_iter()
        .filter(|&v| matches!(gg.node(v).op(), Some(Op::Matmul)))
        .count();
    assert!(n >= 2, "linear backward uses matmuls");
}

// ---- the smelt binary ---------------------------------------------------------------------

const LINREG: &str = "\
graph lr(%x: f32[3,2], %w: f32[2,1], %b: f32[1], %n: i64[3]) {
  %xw = matmul(%x, %w)
  %p = add(%xw, %b)
  %q = mul(%p, %p)
  return %q
}
";

#[test]
fn smelt_grad_writes_hand_computed_gradients() {
    let d = temp_dir("ok");
    std::fs::write(d.join("m.smelt"), LINREG).unwrap();
    let x = [1.0f32, 2.0, -1.0, 0.5, 3.0, -2.0];
    let w = [0.5f32, -1.0];
    let bv = 0.25f32;
    write_npy(d.join("x.npy"), &Tensor::from_slice(&x, &[3, 2]).unwrap()).unwrap();
    write_npy(d.join("w.npy"), &Tensor::from_slice(&w, &[2, 1]).unwrap()).unwrap();
    write_npy(d.join("b.npy"), &Tensor::from_slice(&[bv], &[1]).unwrap()).unwrap();
    write_npy(d.join("n.npy"), &Tensor::zeros(&[3], DType::I64)).unwrap();
    let o = smelt_in(
        &d,
        &[
            "grad", "m.smelt", "--wrt", "x,w,b", "--input", "x=x.npy", "--input", "w=w.npy",
            "--input", "b=b.npy", "--input", "n=n.npy", "--out", "g",
        ],
    );
    assert!(o.status.success(), "{}", String::from_utf8_lossy(&o.stderr));
    // sum(p²): dp = 2p; dx = dp·wᵀ, dw = xᵀ·dp, db = Σdp.
    let p: Vec<f64> = (0..3)
        .map(|i| (x[2 * i] * w[0] + x[2 * i + 1] * w[1] + bv) as f64)
        .collect();
    let dx: Vec<f64> = (0..6).map(|k| 2.0 * p[k / 2] * w[k % 2] as f64).collect();
    let dw: Vec<f64> = (0..2)
        .map(|j| (0..3).map(|i| 2.0 * p[i] * x[2 * i + j] as f64).sum())
        .collect();
    let db: f64 = p.iter().map(|v| 2.0 * v).sum();
    let gx = read_npy(d.join("g/grad_x.npy")).unwrap();
    assert_eq!(gx.shape(), &[3, 2]);
    let tol = Tol::allclose(1e-6, 1e-6);
    assert_close(&gx.to_f64_vec(), &dx, tol, "grad_x");
    let gw = read_npy(d.join("g/grad_w.npy")).unwrap();
    assert_close(&gw.to_f64_vec(), &dw, tol, "grad_w");
    let gb = read_npy(d.join("g/grad_b.npy")).unwrap();
    assert_close(&gb.to_f64_vec(), &[db], tol, "grad_b");

    let bad = smelt_in(
        &d,
        &[
            "grad", "m.smelt", "--wrt", "z", "--input", "x=x.npy", "--out", "g2",
        ],
    );
    assert_eq!(bad.status.code(), Some(1));
    assert!(String::from_utf8_lossy(&bad.stderr).contains("no input named 'z'"));
    let int = smelt_in(
        &d,
        &[
            "grad", "m.smelt", "--wrt", "n", "--input", "x=x.npy", "--input", "w=w.npy", "--input",
            "b=b.npy", "--input", "n=n.npy", "--out", "g3",
        ],
    );
    assert_eq!(int.status.code(), Some(1));
    assert!(String::from_utf8_lossy(&int.stderr).contains("only floating-point inputs"));
}

/// y = x · wᵀ + b on a [batch, sequence, features] input, loss = Σ y²: the gradients are
/// g = 2y, gx = g · w, gw = Σ_rows gᵀ x, gb = Σ_rows g, computed here in f64 by loops.
#[test]
fn linear_on_a_batch_of_sequences_has_gradients() {
    let (b, s, i, o) = (2usize, 3usize, 4usize, 5usize);
    let x = det(&[b, s, i], 1);
    let w = det(&[o, i], 2);
    let bias = det(&[o], 3);
    let (xv, wv, bv) = (x.to_f64_vec(), w.to_f64_vec(), bias.to_f64_vec());
    let rows = b * s;
    let mut g = vec![0.0; rows * o];
    for r in 0..rows {
        for k in 0..o {
            let y: f64 = (0..i).map(|c| xv[r * i + c] * wv[k * i + c]).sum::<f64>() + bv[k];
            g[r * o + k] = 2.0 * y;
        }
    }
    let mut gx = vec![0.0; rows * i];
    let mut gw = vec![0.0; o * i];
    let mut gb = vec![0.0; o];
    for r in 0..rows {
        for k in 0..o {
            gb[k] += g[r * o + k];
            for c in 0..i {
                gx[r * i + c] += g[r * o + k] * wv[k * i + c];
                gw[k * i + c] += g[r * o + k] * xv[r * i + c];
            }
        }
    }
    let text = "graph lin(%x: f64[2,3,4], %w: f64[5,4], %b: f64[5]) {
  %y = linear(%x, %w, %b)
  %l = mul(%y, %y)
  return %l
}
";
    let m = parse_module(text, "lin").unwrap();
    let gg = autodiff(m.entry(), &["x", "w", "b"]).unwrap();
    let inputs = [("x", x.clone()), ("w", w.clone()), ("b", bias.clone())];
    let out = interp::run(&gg, &inputs).unwrap();
    let n = out.len();
    assert_close(&out[n - 3], &gx, 1e-12, "graph grad_x");
    assert_close(&out[n - 2], &gw, 1e-12, "graph grad_w");
    assert_close(&out[n - 1], &gb, 1e-12, "graph grad_b");
    assert_eq!(out[n - 3].shape(), &[b, s, i]);
    // eagerly, through the tape
    for t in [&x, &w, &bias] {
        t.requires_grad_(true).unwrap();
    }
    let y = x.linear(&w, Some(&bias)).unwrap();
    y.mul(&y).unwrap().sum().unwrap().backward().unwrap();
    assert_close(&x.grad().unwrap(), &gx, 1e-12, "eager grad_x");
    assert_close(&w.grad().unwrap(), &gw, 1e-12, "eager grad_w");
    assert_close(&bias.grad().unwrap(), &gb, 1e-12, "eager grad_b");
}

/// Einsum gradients with a repeated subscript (a diagonal): the result's gradient lands on
/// the diagonal and zeros elsewhere, as PyTorch's. Hand-computed in f64.
#[test]
fn einsum_repeated_subscripts_have_gradients() {
    let x = det(&[3, 3], 4);
    let xv = x.to_f64_vec();
    // diag: y = x[i,i], loss Σ y²: grad 2·x[i,i] on the diagonal
    let diag: Vec<f64> = (0..9)
        .map(|k| if k % 4 == 0 { 2.0 * xv[k] } else { 0.0 })
        .collect();
    // trace: loss = (Σ x[i,i])²: grad 2·trace on the diagonal
    let tr: f64 = (0..3).map(|k| xv[k * 4]).sum();
    let trace: Vec<f64> = (0..9)
        .map(|k| if k % 4 == 0 { 2.0 * tr } else { 0.0 })
        .collect();
    for (eq, want) in [("ii->i", &diag), ("ii", &trace)] {
        let text = format!(
            "graph e(%x: f64[3,3]) {{\n  %y = einsum(%x, equation=\"{eq}\")\n  %l = mul(%y, %y)\n  return %l\n}}\n"
        );
        let m = parse_module(&text, "e").unwrap();
        let gg = autodiff(m.entry(), &["x"]).unwrap();
        let out = interp::run(&gg, &[("x", x.clone())]).unwrap();
        assert_close(out.last().unwrap(), want, 1e-12, eq);
        let leaf = x.clone();
        leaf.requires_grad_(true).unwrap();
        let y = smelt::runtime::apply(
            Op::Einsum {
                equation: eq.to_string(),
            },
            &[&leaf],
        )
        .unwrap();
        y.mul(&y).unwrap().sum().unwrap().backward().unwrap();
        assert_close(&leaf.grad().unwrap(), want, 1e-12, &format!("eager {eq}"));
        leaf.set_grad(None);
        leaf.requires_grad_(false).unwrap();
    }
    // a diagonal over two of three dims, contracted with another operand:
    // y[j] = Σ_i x[i,i,j] · w[j], loss Σ y: grad_x[i,k,j] = δ_ik · w[j]
    let x3 = det(&[2, 2, 3], 5);
    let w = det(&[3], 6);
    let wv = w.to_f64_vec();
    let want: Vec<f64> = (0..12)
        .map(|k| {
            let (i, kk, j) = (k / 6, (k / 3) % 2, k % 3);
            if i == kk { wv[j] } else { 0.0 }
        })
        .collect();
    let text = "graph e(%x: f64[2,2,3], %w: f64[3]) {
  %y = einsum(%x, %w, equation=\"iij,j->j\")
  return %y
}
";
    let m = parse_module(text, "e").unwrap();
    let gg = autodiff(m.entry(), &["x"]).unwrap();
    let out = interp::run(&gg, &[("x", x3), ("w", w)]).unwrap();
    assert_close(out.last().unwrap(), &want, 1e-12, "iij,j->j");
}
