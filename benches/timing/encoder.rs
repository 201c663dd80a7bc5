//! A BERT-sized encoder as `.smelt` text (all-MiniLM-L6's shapes: post-norm layers, exact
//! GELU, PyTorch's layouts), its batch and sequence written as given: numbers, or symbols.

use std::fmt::Write;

/// Width, heads, FFN width and layers.
pub struct Dims {
    pub d: usize,
    pub h: usize,
    pub f: usize,
    pub l: usize,
}

/// MiniLM-L6's sizes.
pub const MINILM: Dims = Dims {
    d: 384,
    h: 12,
    f: 1536,
    l: 6,
};

/// The encoder over `x: f32[b, t, d]` and each layer's weights (`l{i}_wq`, ...); `b` and `t`
/// are written as given (`"32"`, or `"B"` for a symbol).
pub fn encoder_text(b: &str, t: &str, dims: &Dims) -> String {
    let Dims { d, h, f, l } = *dims;
    let dh = d / h;
    let mut params = format!("%x: f32[{b},{t},{d}]");
    let mut body = String::new();
    let mut x = "x".to_string();
    for layer in 0..l {
        for (n, shape) in [
            ("wq", format!("{d},{d}")),
            ("bq", format!("{d}")),
            ("wk", format!("{d},{d}")),
            ("bk", format!("{d}")),
            ("wv", format!("{d},{d}")),
            ("bv", format!("{d}")),
            ("wo", format!("{d},{d}")),
            ("bo", format!("{d}")),
            ("g1", format!("{d}")),
            ("e1", format!("{d}")),
            ("w1", format!("{f},{d}")),
            ("b1", format!("{f}")),
            ("w2", format!("{d},{f}")),
            ("b2", format!("{d}")),
            ("g2", format!("{d}")),
            ("e2", format!("{d}")),
        ] {
            let _ = write!(params, ", %l{layer}_{n}: f32[{shape}]");
        }
        let p = format!("l{layer}_");
        for q in ["q", "k", "v"] {
            let _ = writeln!(
                body,
                "  %{p}{q} = linear(%{x}, %{p}w{q}, %{p}b{q})
  %{p}{q}4 = reshape(%{p}{q}, shape=[{b}, {t}, {h}, {dh}])
  %{p}{q}h = transpose(%{p}{q}4, dim0=1, dim1=2)"
            );
        }
        let _ = writeln!(
            body,
            "  %{p}a = scaled_dot_product_attention(%{p}qh, %{p}kh, %{p}vh)
  %{p}at = transpose(%{p}a, dim0=1, dim1=2)
  %{p}ac = reshape(%{p}at, shape=[{b}, {t}, {d}])
  %{p}o = linear(%{p}ac, %{p}wo, %{p}bo)
  %{p}r1 = add(%{x}, %{p}o)
  %{p}h1 = layer_norm(%{p}r1, %{p}g1, %{p}e1, normalized_shape=[{d}], eps=1e-12)
  %{p}f = linear(%{p}h1, %{p}w1, %{p}b1)
  %{p}fg = gelu(%{p}f)
  %{p}f2 = linear(%{p}fg, %{p}w2, %{p}b2)
  %{p}r2 = add(%{p}h1, %{p}f2)
  %{p}y = layer_norm(%{p}r2, %{p}g2, %{p}e2, normalized_shape=[{d}], eps=1e-12)"
        );
        x = format!("{p}y");
    }
    format!("graph bert({params}) {{\n{body}  return %{x}\n}}\n")
}

/// Random inputs for the encoder's graph `g`: weights ~ N(0, 0.02) as BERT initialises them,
/// the norms' scales 1, `x` ~ N(0, 1).
pub fn encoder_inputs(g: &smelt::ir::Graph, seed: u64) -> Vec<smelt::Tensor> {
    use smelt::{DType, Generator, Tensor};
    let mut rng = Generator::new(seed);
    g.inputs()
        .iter()
        .map(|&v| {
            let node = g.node(v);
            let t = Tensor::randn_with(&node.ty.shape, Some(DType::F32), &mut rng).unwrap();
            match node.name.rsplit('_').next() {
                Some("g1" | "g2") => t.mul_scalar(0.0).unwrap().add_scalar(1.0).unwrap(),
                Some("x") => t,
                _ => t.mul_scalar(0.02).unwrap(),
            }
        })
        .collect()
}
