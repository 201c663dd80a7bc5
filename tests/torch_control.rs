//! Gradients through `cond` and `scan` against PyTorch's own (`torch.cond` and the
//! higher-order `scan`, `scripts/torch_control.py`) on the same float64 inputs. It needs a
//! Python with torch (`SMELT_TORCH_PYTHON`, else `python3`); without one, and always in CI,
//! it says why it skips.

mod common;

use smelt::ir::parse_module;
use smelt::passes::autodiff::autodiff;
use smelt::{DType, Tensor};
use std::io::Write;
use std::process::{Command, Stdio};

/// PyTorch's answer to one case (JSON in, JSON out).
fn torch(python: &str, case: &str) -> serde_json::Value {
    let script = concat!(env!("CARGO_MANIFEST_DIR"), "/scripts/torch_control.py");
    let mut child = Command::new(python)
        .arg(script)
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .spawn()
        .unwrap();
    child
        .stdin
        .take()
        .unwrap()
        .write_all(case.as_bytes())
        .unwrap();
    let out = child.wait_with_output().unwrap();
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stdout)
    );
    serde_json::from_slice(&out.stdout).unwrap()
}

fn flat(v: &serde_json::Value) -> Vec<f64> {
    match v {
        serde_json::Value::Array(xs) => xs.iter().flat_map(flat).collect(),
        x => vec![x.as_f64().unwrap()],
    }
}

fn json(t: &Tensor) -> String {
    let v = t.to_f64_vec();
    match t.shape() {
        [_, n] => {
            let rows: Vec<String> = v.chunks(*n).map(|r| format!("{r:?}")).collect();
            format!("[{}]", rows.join(","))
        }
        _ => format!("{v:?}"),
    }
}

/// smelt's gradients of the sum of the outputs with respect to `wrt`.
fn smelt_grads(text: &str, wrt: &[&str], inputs: &[Tensor]) -> Vec<Vec<f64>> {
    let g = parse_module(text, "t.smelt").unwrap().entry().clone();
    let d = autodiff(&g, wrt).unwrap();
    let out = smelt::jit::run_graph(&d, inputs).unwrap();
    out[out.len() - wrt.len()..]
        .iter()
        .map(Tensor::to_f64_vec)
        .collect()
}

fn close(got: &[f64], want: &[f64], what: &str) {
    assert_eq!(got.len(), want.len(), "{what}");
    for (a, b) in got.iter().zip(want) {
        assert!(
            (a - b).abs() <= 1e-10 * (1.0 + b.abs()),
            "{what}: {a} vs {b}"
        );
    }
}

#[test]
fn cond_gradients_match_torch_cond() {
    let Some(python) = common::torch::python_with_torch() else {
        return;
    };
    let text = "
graph main(%p: bool[], %x: f64[3], %y: f64[3]) {
  %z = cond(%p, %x, %y, then=@t, else=@e)
  return %z
}
graph t(%x: f64[3], %y: f64[3]) {
  %m = mul(%x, %y)
  %e = exp(%m)
  return %e
}
graph e(%x: f64[3], %y: f64[3]) {
  %s = sub(%x, %y)
  %q = mul(%s, %s)
  return %q
}";
    for p in [true, false] {
        let x = Tensor::randn(&[3], Some(DType::F64)).unwrap();
        let y = Tensor::randn(&[3], Some(DType::F64)).unwrap();
        let got = smelt_grads(
            text,
            &["x", "y"],
            &[Tensor::scalar(p), x.clone(), y.clone()],
        );
        let want = torch(
            &python,
            &format!(
                r#"{{"case": "cond", "p": {p}, "x": {}, "y": {}}}"#,
                json(&x),
                json(&y)
            ),
        );
        close(&got[0], &flat(&want["x"]), &format!("p={p}: d/dx"));
        close(&got[1], &flat(&want["y"]), &format!("p={p}: d/dy"));
    }
}

#[test]
fn scan_gradients_match_torch_scan() {
    let Some(python) = common::torch::python_with_torch() else {
        return;
    };
    for (len, reverse) in [(4, false), (3, true)] {
        let text = format!(
            "graph main(%c: f64[3], %w: f64[3], %xs: f64[{len},3]) {{
  %cf, %w2, %ys = scan(%c, %w, %xs, body=@s, carries=2, reverse={reverse})
  return %cf, %ys
}}
graph s(%c: f64[3], %w: f64[3], %x: f64[3]) {{
  %m = mul(%c, %w)
  %n = add(%m, %x)
  %t = tanh(%n)
  %y = mul(%t, %x)
  return %t, %w, %y
}}"
        );
        let c = Tensor::randn(&[3], Some(DType::F64)).unwrap();
        let w = Tensor::randn(&[3], Some(DType::F64)).unwrap();
        let xs = Tensor::randn(&[len, 3], Some(DType::F64)).unwrap();
        let got = smelt_grads(
            &text,
            &["c", "w", "xs"],
            &[c.clone(), w.clone(), xs.clone()],
        );
        let want = torch(
            &python,
            &format!(
                r#"{{"case": "scan", "c": {}, "w": {}, "xs": {}, "reverse": {reverse}}}"#,
                json(&c),
                json(&w),
                json(&xs)
            ),
        );
        for (k, name) in ["c", "w", "xs"].iter().enumerate() {
            close(
                &got[k],
                &flat(&want[*name]),
                &format!("len {len} reverse {reverse}: d/d{name}"),
            );
        }
    }
}
