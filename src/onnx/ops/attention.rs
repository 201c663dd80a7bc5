//! `Attention` (opsets 23, 24, and the window attributes of 25), decomposed as the ONNX
//! reference computes it: `softmax((Q·√s)(K·√s)ᵀ, softcapped, + bias) · V`, where the bias
//! gathers the mask, the causal and window limits and the key padding, and a query row
//! whose bias is all `-inf` gives zeros.

use super::elementwise::cast_to;
use super::list;
use crate::ir::attrs::Attr;
use crate::ir::graph::ValueId;
use crate::onnx::import::{Cx, Val};
use crate::{DType, Result, Tensor, bail};

fn dims(s: &[usize]) -> Vec<i64> {
    s.iter().map(|&d| d as i64).collect()
}

fn reshape(cx: &mut Cx, x: ValueId, s: &[i64]) -> Result<ValueId> {
    cx.call("reshape", &[Some(x)], &[("shape", list(s))])
}

/// `[B, S, H·D]` → `[B, H, S, D]`.
fn split_heads(cx: &mut Cx, x: ValueId, heads: i64, what: &str) -> Result<ValueId> {
    let s = cx.shape(x);
    if heads <= 0 || s[2] as i64 % heads != 0 {
        bail!(
            Value,
            "{what}'s hidden size {} is not a multiple of {heads} heads",
            s[2]
        );
    }
    let y = reshape(
        cx,
        x,
        &[s[0] as i64, s[1] as i64, heads, s[2] as i64 / heads],
    )?;
    cx.call("permute", &[Some(y)], &[("dims", list(&[0, 2, 1, 3]))])
}

/// The additive form of an "allowed" mask: 0 where allowed, `-inf` elsewhere.
fn additive(cx: &mut Cx, allowed: ValueId, dt: DType) -> Result<ValueId> {
    let zero = cx.scalar(0.0, dt)?;
    let ninf = cx.scalar(f64::NEG_INFINITY, dt)?;
    cx.call("where", &[Some(allowed), Some(zero), Some(ninf)], &[])
}

fn add_bias(cx: &mut Cx, bias: Option<ValueId>, b: ValueId) -> Result<ValueId> {
    match bias {
        Some(a) => cx.call("add", &[Some(a), Some(b)], &[]),
        None => Ok(b),
    }
}

/// The softmax of the ONNX reference: a row that is all `-inf` gives zeros, not NaN.
fn safe_softmax(cx: &mut Cx, x: ValueId) -> Result<ValueId> {
    let dt = cx.dtype(x);
    let keep = [("dim", list(&[-1])), ("keepdim", Attr::Bool(true))];
    let m = cx.call("amax", &[Some(x)], &keep)?;
    let ninf = cx.scalar(f64::NEG_INFINITY, dt)?;
    let zero = cx.scalar(0.0, dt)?;
    let one = cx.scalar(1.0, dt)?;
    let all_masked = cx.call("eq", &[Some(m), Some(ninf)], &[])?;
    let m = cx.call("where", &[Some(all_masked), Some(zero), Some(m)], &[])?;
    let d = cx.call("sub", &[Some(x), Some(m)], &[])?;
    let e = cx.call("exp", &[Some(d)], &[])?;
    let s = cx.call("sum", &[Some(e)], &keep)?;
    let empty = cx.call("eq", &[Some(s), Some(zero)], &[])?;
    let s = cx.call("where", &[Some(empty), Some(one), Some(s)], &[])?;
    cx.call("div", &[Some(e), Some(s)], &[])
}

/// Grouped-query attention: each of K's and V's heads (dim 1) serves `hq / heads` query
/// heads in a row, so both are repeated to `hq` heads.
fn share_kv_heads(cx: &mut Cx, k: ValueId, v: ValueId, hq: usize) -> Result<(ValueId, ValueId)> {
    let hkv = cx.shape(k)[1];
    if hq == hkv {
        return Ok((k, v));
    }
    if hkv == 0 || !hq.is_multiple_of(hkv) {
        bail!(Value, "{hq} query heads cannot share {hkv} key/value heads");
    }
    let rep = hq / hkv;
    let mut out = Vec::new();
    for x in [k, v] {
        let s = dims(&cx.shape(x));
        let u = cx.call("unsqueeze", &[Some(x)], &[("dim", Attr::Int(2))])?;
        let size = list(&[s[0], s[1], rep as i64, s[2], s[3]]);
        let e = cx.call("expand", &[Some(u)], &[("size", size)])?;
        out.push(reshape(cx, e, &[s[0], hq as i64, s[2], s[3]])?);
    }
    Ok((out[0], out[1]))
}

/// `(q·root)·(k·root)ᵀ` with `root` (√scale) rounded to Q's dtype: both factors scaled, in
/// their dtype, as the ONNX reference does.
fn scaled_scores(cx: &mut Cx, q: ValueId, k: ValueId, root: f64) -> Result<ValueId> {
    let root = cx.scalar(root, cx.dtype(q))?;
    let qr = cx.call("mul", &[Some(q), Some(root)], &[])?;
    let kr = cx.call("mul", &[Some(k), Some(root)], &[])?;
    let kt = cx.call(
        "transpose",
        &[Some(kr)],
        &[("dim0", Attr::Int(-2)), ("dim1", Attr::Int(-1))],
    )?;
    cx.call("matmul", &[Some(qr), Some(kt)], &[])
}

/// `FlexAttention` (`ai.onnx.preview`): rank-4 attention whose scores and probabilities
/// pass through the `score_mod` and `prob_mod` subgraphs, inlined. As the reference: Q and
/// K scaled by √scale in their dtype, the scores cast to `softmax_precision` (f32, or f64
/// for f64 inputs) for the modifiers, the softmax and the product with V.
pub fn flex_attention(cx: &mut Cx) -> Result<Vec<Val>> {
    let (q, k, v) = (cx.x(0)?, cx.x(1)?, cx.x(2)?);
    let dt = cx.dtype(q);
    if !dt.is_float() {
        bail!(Value, "Q must hold floats, got {dt}");
    }
    let (qs, ks, vs) = (cx.shape(q), cx.shape(k), cx.shape(v));
    if qs.len() != 4 || ks.len() != 4 || vs.len() != 4 {
        bail!(Value, "Q, K and V must be 4-D, got {qs:?}, {ks:?}, {vs:?}");
    }
    if ks[0] != qs[0] || vs[0] != qs[0] || ks[1] != vs[1] || ks[3] != qs[3] || ks[2] != vs[2] {
        bail!(Value, "Q {qs:?}, K {ks:?} and V {vs:?} do not fit together");
    }
    let precision = match cx.dtype_attr("softmax_precision")? {
        Some(p) => p,
        None if dt == DType::F64 => DType::F64,
        None => DType::F32,
    };
    let (k, v) = share_kv_heads(cx, k, v, qs[1])?;
    let scale = match cx.attr("scale") {
        Some(_) => cx.float("scale", 0.0)? as f32,
        None => 1.0 / (qs[3] as f32).sqrt(),
    };
    let qk = scaled_scores(cx, q, k, f64::from(scale.sqrt()))?;
    let mut scores = cast_to(cx, qk, precision)?;
    if cx.attr("score_mod").is_some() {
        let g = super::control::body(cx, "score_mod")?;
        scores = one_output(cx, &g, scores, "score_mod")?;
    }
    let mut probs = cx.call("softmax", &[Some(scores)], &[("dim", Attr::Int(-1))])?;
    if cx.attr("prob_mod").is_some() {
        let g = super::control::body(cx, "prob_mod")?;
        probs = one_output(cx, &g, probs, "prob_mod")?;
    }
    let v = cast_to(cx, v, precision)?;
    let y = cx.call("matmul", &[Some(probs), Some(v)], &[])?;
    Ok(vec![Val::node(cast_to(cx, y, dt)?)])
}

/// A modifier subgraph inlined on `x`: its one output, of `x`'s shape.
fn one_output(
    cx: &mut Cx,
    g: &crate::onnx::proto::GraphProto,
    x: ValueId,
    what: &str,
) -> Result<ValueId> {
    let shape = cx.shape(x);
    let outs = super::control::inline(cx, g, vec![Val::node(x)])?;
    let [out] = outs.as_slice() else {
        bail!(Value, "{what} must have one output, has {}", outs.len());
    };
    let y = super::control::materialize(cx, out)?;
    if cx.shape(y) != shape {
        bail!(
            Value,
            "{what} must keep the shape {shape:?}, gives {:?}",
            cx.shape(y)
        );
    }
    Ok(y)
}

pub fn attention(cx: &mut Cx) -> Result<Vec<Val>> {
    let (q, k, v) = (cx.x(0)?, cx.x(1)?, cx.x(2)?);
    let mask = cx.opt(3)?;
    let (past_k, past_v) = (cx.opt(4)?, cx.opt(5)?);
    let nonpad = if cx.opset() >= 24 { cx.opt(6)? } else { None };
    if past_k.is_some() != past_v.is_some() {
        bail!(Value, "past_key and past_value must be given together");
    }
    if nonpad.is_some() && past_k.is_some() {
        bail!(
            Value,
            "nonpad_kv_seqlen cannot be combined with past_key/past_value"
        );
    }
    let dt = cx.dtype(q);
    if !dt.is_float() {
        bail!(Value, "Q must hold floats, got {dt}");
    }
    let rank = cx.rank(q);
    if cx.rank(k) != rank || cx.rank(v) != rank || !(rank == 3 || rank == 4) {
        bail!(
            Value,
            "Q, K and V must all be 3-D or all 4-D, got {:?}, {:?}, {:?}",
            cx.shape(q),
            cx.shape(k),
            cx.shape(v)
        );
    }
    let is_causal = cx.int("is_causal", 0)? != 0;
    let mode = cx.int("qk_matmul_output_mode", 0)?;
    if !(0..=3).contains(&mode) {
        bail!(
            Value,
            "qk_matmul_output_mode {mode} is not one of 0, 1, 2, 3"
        );
    }
    let softcap = cx.float("softcap", 0.0)?;
    let precision = cx.dtype_attr("softmax_precision")?;
    let left = cx.int("left_window_size", -1)?;
    let right = cx.int("right_window_size", -1)?;
    if left < -1 || right < -1 {
        bail!(
            Value,
            "window sizes must be -1 or nonnegative, got {left} and {right}"
        );
    }
    let (q, k, v) = if rank == 3 {
        let heads = |cx: &Cx, name: &str| -> Result<Option<i64>> {
            cx.attr(name).map(|_| cx.int(name, 0)).transpose()
        };
        let (Some(hq), Some(hkv)) = (heads(cx, "q_num_heads")?, heads(cx, "kv_num_heads")?) else {
            bail!(
                Value,
                "3-D inputs need the q_num_heads and kv_num_heads attributes"
            );
        };
        (
            split_heads(cx, q, hq, "Q")?,
            split_heads(cx, k, hkv, "K")?,
            split_heads(cx, v, hkv, "V")?,
        )
    } else {
        (q, k, v)
    };
    let (qs, ks, vs) = (cx.shape(q), cx.shape(k), cx.shape(v));
    if ks[0] != qs[0] || vs[0] != qs[0] || ks[1] != vs[1] || ks[3] != qs[3] || ks[2] != vs[2] {
        bail!(Value, "Q {qs:?}, K {ks:?} and V {vs:?} do not fit together");
    }
    let (batch, hq, q_len, head) = (qs[0], qs[1], qs[2], qs[3]);
    let cat = |cx: &mut Cx, past: Option<ValueId>, x: ValueId| match past {
        Some(p) => cx.call("cat", &[Some(p), Some(x)], &[("dim", Attr::Int(2))]),
        None => Ok(x),
    };
    let k = cat(cx, past_k, k)?;
    let v = cat(cx, past_v, v)?;
    let (present_k, present_v) = (k, v);
    let kv_len = cx.shape(k)[2];
    let past_len = past_k.map_or(0, |p| cx.shape(p)[2]);

    // the bias: the mask, padded to kv_len, in additive form
    let mut bias = match mask {
        Some(m) => {
            let ms = cx.shape(m);
            let last = *ms.last().unwrap_or(&0);
            let bool_mask = cx.dtype(m) == DType::Bool;
            let m = if last < kv_len {
                let mut ps = ms.clone();
                let Some(pad) = ps.last_mut() else {
                    bail!(Value, "a 0-d attn_mask cannot cover {kv_len} keys");
                };
                *pad = kv_len - last;
                let fill = if bool_mask {
                    Attr::Bool(false)
                } else {
                    Attr::Float(f64::NEG_INFINITY)
                };
                let pad = cx.call(
                    "full",
                    &[],
                    &[
                        ("size", list(&dims(&ps))),
                        ("fill_value", fill),
                        ("dtype", Attr::DType(cx.dtype(m))),
                    ],
                )?;
                cx.call("cat", &[Some(m), Some(pad)], &[("dim", Attr::Int(-1))])?
            } else {
                m
            };
            Some(if bool_mask {
                additive(cx, m, dt)?
            } else {
                cast_to(cx, m, dt)?
            })
        }
        None => None,
    };
    // causal and window limits: key j is allowed for query i iff d = i + offset - j has
    // d >= 0 (causal), d <= left and -d <= right, with the offset the keys before the block
    let windowed = left >= 0 || right >= 0;
    if is_causal || windowed {
        let i_col: Vec<i64> = (0..q_len as i64).collect();
        let j_row: Vec<i64> = (0..kv_len as i64).collect();
        let i_t = cx.tensor(&Tensor::from_vec(i_col, &[q_len, 1])?)?;
        let j_t = cx.tensor(&Tensor::from_vec(j_row, &[1, kv_len])?)?;
        let pos = match nonpad {
            // per batch: offset[b] = nonpad_kv_seqlen[b] - q_len, giving d of [B, q, kv]
            Some(n) if past_k.is_none() => {
                let n = cast_to(cx, n, DType::I64)?;
                let n = reshape(cx, n, &[batch as i64, 1, 1])?;
                let ql = cx.scalar(q_len as f64, DType::I64)?;
                let off = cx.call("sub", &[Some(n), Some(ql)], &[])?;
                cx.call("add", &[Some(i_t), Some(off)], &[])?
            }
            _ => {
                let off = cx.scalar(past_len as f64, DType::I64)?;
                cx.call("add", &[Some(i_t), Some(off)], &[])?
            }
        };
        let d = cx.call("sub", &[Some(pos), Some(j_t)], &[])?;
        let mut allowed: Option<ValueId> = None;
        let mut both = |cx: &mut Cx, c: ValueId| -> Result<()> {
            allowed = Some(match allowed {
                Some(a) => cx.call("logical_and", &[Some(a), Some(c)], &[])?,
                None => c,
            });
            Ok(())
        };
        if is_causal {
            let zero = cx.scalar(0.0, DType::I64)?;
            let c = cx.call("ge", &[Some(d), Some(zero)], &[])?;
            both(cx, c)?;
        }
        if left >= 0 {
            let l = cx.scalar(left as f64, DType::I64)?;
            let c = cx.call("le", &[Some(d), Some(l)], &[])?;
            both(cx, c)?;
        }
        if right >= 0 {
            let r = cx.scalar(-right as f64, DType::I64)?;
            let c = cx.call("ge", &[Some(d), Some(r)], &[])?;
            both(cx, c)?;
        }
        let allowed = allowed.expect("causal or windowed");
        let mut a = additive(cx, allowed, dt)?;
        if cx.rank(a) == 3 {
            // [B, q, kv] → [B, 1, q, kv], leaving a rank-3 mask's (heads, q, kv) alone
            a = reshape(cx, a, &[batch as i64, 1, q_len as i64, kv_len as i64])?;
        }
        bias = Some(add_bias(cx, bias, a)?);
    }
    if let Some(n) = nonpad {
        let n = cast_to(cx, n, DType::I64)?;
        let n = reshape(cx, n, &[batch as i64, 1, 1, 1])?;
        let j: Vec<i64> = (0..kv_len as i64).collect();
        let j = cx.tensor(&Tensor::from_vec(j, &[kv_len])?)?;
        let ok = cx.call("lt", &[Some(j), Some(n)], &[])?;
        let a = additive(cx, ok, dt)?;
        bias = Some(add_bias(cx, bias, a)?);
    }

    let (k, v) = share_kv_heads(cx, k, v, hq)?;

    let scale = match cx.attr("scale") {
        Some(_) => cx.float("scale", 0.0)?,
        None => 1.0 / (head as f64).sqrt(),
    };
    let mut qk = scaled_scores(cx, q, k, scale.sqrt())?;
    if softcap > 0.0 {
        let c = cx.scalar(softcap, dt)?;
        let t = cx.call("div", &[Some(qk), Some(c)], &[])?;
        let t = cx.call("tanh", &[Some(t)], &[])?;
        qk = cx.call("mul", &[Some(t), Some(c)], &[])?;
    }
    let with_bias = match bias {
        Some(b) => cx.call("add", &[Some(qk), Some(b)], &[])?,
        None => qk,
    };
    let logits = match precision {
        Some(p) => cast_to(cx, with_bias, p)?,
        None => with_bias,
    };
    let mut probs = safe_softmax(cx, logits)?;
    if let Some(b) = bias {
        // a row whose bias allows no key gives zeros, whatever the logits
        let keep = [("dim", list(&[-1])), ("keepdim", Attr::Bool(true))];
        let m = cx.call("amax", &[Some(b)], &keep)?;
        let ninf = cx.scalar(f64::NEG_INFINITY, dt)?;
        let none = cx.call("eq", &[Some(m), Some(ninf)], &[])?;
        let zero = cx.scalar(0.0, cx.dtype(probs))?;
        probs = cx.call("where", &[Some(none), Some(zero), Some(probs)], &[])?;
    }
    let probs = cast_to(cx, probs, dt)?;
    let qk_out = match mode {
        2 => with_bias,
        3 => probs,
        _ => qk,
    };
    let mut y = cx.call("matmul", &[Some(probs), Some(v)], &[])?;
    if rank == 3 {
        let p = cx.call("permute", &[Some(y)], &[("dims", list(&[0, 2, 1, 3]))])?;
        let s = cx.shape(p);
        y = reshape(cx, p, &[s[0] as i64, s[1] as i64, (s[2] * s[3]) as i64])?;
    }
    Ok(vec![
        Val::node(y),
        Val::node(present_k),
        Val::node(present_v),
        Val::node(qk_out),
    ])
}

/// `RotaryEmbedding`: the first `rotary_embedding_dim` features of each head rotated by the
/// cached cos/sin of its position, as pairs (`interleaved`) or as two halves.
pub fn rotary_embedding(cx: &mut Cx) -> Result<Vec<Val>> {
    let (x, cos, sin) = (cx.x(0)?, cx.x(1)?, cx.x(2)?);
    let pos = cx.opt(3)?;
    let shape = cx.shape(x);
    let interleaved = cx.int("interleaved", 0)? != 0;
    let heads = cx.int("num_heads", 0)?;
    // [B, S, H, D] either way
    let y = match shape.len() {
        4 => cx.call("permute", &[Some(x)], &[("dims", list(&[0, 2, 1, 3]))])?,
        3 => {
            if heads <= 0 || shape[2] as i64 % heads != 0 {
                bail!(
                    Value,
                    "a 3-D input needs num_heads dividing its {} features",
                    shape[2]
                );
            }
            let dims = [
                shape[0] as i64,
                shape[1] as i64,
                heads,
                shape[2] as i64 / heads,
            ];
            cx.call("reshape", &[Some(x)], &[("shape", list(&dims))])?
        }
        _ => bail!(Value, "the input should be 3-D or 4-D, got {shape:?}"),
    };
    let head = cx.shape(y)[3] as i64;
    let rd = match cx.int("rotary_embedding_dim", 0)? {
        0 => head,
        d if d > 0 && d <= head && d % 2 == 0 => d,
        d => bail!(Value, "rotary_embedding_dim {d} for heads of {head}"),
    };
    let part = |cx: &mut Cx, v: ValueId, start: i64, end: i64, step: i64| {
        cx.call(
            "slice",
            &[Some(v)],
            &[
                ("dim", Attr::Int(-1)),
                ("start", Attr::Int(start)),
                ("end", Attr::Int(end)),
                ("step", Attr::Int(step)),
            ],
        )
    };
    let rot = part(cx, y, 0, rd, 1)?;
    let (cos, sin) = match pos {
        Some(p) => {
            let p = cast_to(cx, p, DType::I64)?;
            (
                cx.call("embedding", &[Some(p), Some(cos)], &[])?,
                cx.call("embedding", &[Some(p), Some(sin)], &[])?,
            )
        }
        None => (cos, sin),
    };
    if cx.shape(cos).last() != Some(&(rd as usize / 2)) {
        bail!(
            Value,
            "a cos cache of shape {:?} for a rotary dim of {rd}",
            cx.shape(cos)
        );
    }
    let cos = cx.call("unsqueeze", &[Some(cos)], &[("dim", Attr::Int(2))])?;
    let sin = cx.call("unsqueeze", &[Some(sin)], &[("dim", Attr::Int(2))])?;
    let (x1, x2) = if interleaved {
        (part(cx, rot, 0, rd, 2)?, part(cx, rot, 1, rd, 2)?)
    } else {
        (part(cx, rot, 0, rd / 2, 1)?, part(cx, rot, rd / 2, rd, 1)?)
    };
    let mul = |cx: &mut Cx, a: ValueId, b: ValueId| cx.call("mul", &[Some(a), Some(b)], &[]);
    let (c1, s2) = (mul(cx, cos, x1)?, mul(cx, sin, x2)?);
    let real = cx.call("sub", &[Some(c1), Some(s2)], &[])?;
    let (s1, c2) = (mul(cx, sin, x1)?, mul(cx, cos, x2)?);
    let imag = cx.call("add", &[Some(s1), Some(c2)], &[])?;
    let rotated = if interleaved {
        let pairs = cx.call(
            "stack",
            &[Some(real), Some(imag)],
            &[("dim", Attr::Int(-1))],
        )?;
        let dims: Vec<i64> = cx.shape(rot).iter().map(|&d| d as i64).collect();
        cx.call("reshape", &[Some(pairs)], &[("shape", list(&dims))])?
    } else {
        cx.call("cat", &[Some(real), Some(imag)], &[("dim", Attr::Int(-1))])?
    };
    let out = if rd < head {
        let rest = part(cx, y, rd, head, 1)?;
        cx.call(
            "cat",
            &[Some(rotated), Some(rest)],
            &[("dim", Attr::Int(-1))],
        )?
    } else {
        rotated
    };
    let out = if shape.len() == 4 {
        cx.call("permute", &[Some(out)], &[("dims", list(&[0, 2, 1, 3]))])?
    } else {
        let dims: Vec<i64> = shape.iter().map(|&d| d as i64).collect();
        cx.call("reshape", &[Some(out)], &[("shape", list(&dims))])?
    };
    Ok(vec![Val::node(out)])
}

/// The most time steps `LinearAttention` is unrolled to.
const MAX_LINEAR_ATTENTION_STEPS: usize = 512;

/// `[B, T, H*D]` as `[B, H, T, D]` in f32.
fn heads_f32(cx: &mut Cx, x: ValueId, heads: i64) -> Result<ValueId> {
    let s = cx.shape(x);
    if s.len() != 3 || heads <= 0 || s[2] as i64 % heads != 0 {
        bail!(Value, "an input of shape {s:?} for {heads} heads");
    }
    let dims = [s[0] as i64, s[1] as i64, heads, s[2] as i64 / heads];
    let y = cx.call("reshape", &[Some(x)], &[("shape", list(&dims))])?;
    let y = cx.call("permute", &[Some(y)], &[("dims", list(&[0, 2, 1, 3]))])?;
    cast_to(cx, y, DType::F32)
}

/// `LinearAttention`: the recurrent form, unrolled over the time steps at import. A state
/// `S` of `[B, H_kv, d_k, d_v]` decays by `exp(decay)` (gated rules), takes `k ⊗ v` (or,
/// for the delta rules, `k ⊗ beta (v - S·k)`), and each step reads `scale · q·S`, the kv
/// heads repeated over query groups. Computed in f32, as the reference does.
pub fn linear_attention(cx: &mut Cx) -> Result<Vec<Val>> {
    let rule = cx
        .string("update_rule")?
        .unwrap_or_else(|| "gated_delta".into());
    let (gating, delta) = match rule.as_str() {
        "linear" => (false, false),
        "gated" => (true, false),
        "delta" => (false, true),
        "gated_delta" => (true, true),
        other => bail!(Value, "update_rule '{other}' is not one ONNX defines"),
    };
    let (hq, hkv) = (cx.int("q_num_heads", 0)?, cx.int("kv_num_heads", 0)?);
    if hq <= 0 || hkv <= 0 || hq % hkv != 0 {
        bail!(
            Value,
            "q_num_heads {hq} should be a positive multiple of kv_num_heads {hkv}"
        );
    }
    if gating != cx.has(4) || delta != cx.has(5) {
        bail!(
            Value,
            "update_rule '{rule}' takes decay: {gating}, beta: {delta}"
        );
    }
    let (q, k, v) = (cx.x(0)?, cx.x(1)?, cx.x(2)?);
    let out_dtype = cx.dtype(q);
    let qs = cx.shape(q);
    if qs.len() != 3 {
        bail!(Value, "the query has shape {qs:?}, not [B, T, H*d]");
    }
    let (b, t) = (qs[0] as i64, qs[1]);
    if t > MAX_LINEAR_ATTENTION_STEPS {
        bail!(
            Value,
            "{t} time steps (LinearAttention is unrolled; at most {MAX_LINEAR_ATTENTION_STEPS})"
        );
    }
    let q4 = heads_f32(cx, q, hq)?;
    let k4 = heads_f32(cx, k, hkv)?;
    let v4 = heads_f32(cx, v, hkv)?;
    let (dk, dv) = (cx.shape(k4)[3] as i64, cx.shape(v4)[3] as i64);
    if cx.shape(q4)[3] as i64 != dk {
        bail!(
            Value,
            "query heads of {} features, key heads of {dk}",
            cx.shape(q4)[3]
        );
    }
    // decay [B, T, H_kv or H_kv*d_k] and beta [B, T, H_kv or 1] as [B, H, T, 1 or d_k]
    let decay = match cx.opt(4)? {
        Some(d) => {
            let last = cx.shape(d).get(2).copied().unwrap_or(0) as i64;
            if last != hkv && last != hkv * dk {
                bail!(
                    Value,
                    "decay's last dim {last} should be {hkv} or {}",
                    hkv * dk
                );
            }
            let d4 = heads_f32(cx, d, hkv)?;
            Some(cx.call("exp", &[Some(d4)], &[])?)
        }
        None => None,
    };
    let beta = match cx.opt(5)? {
        Some(bt) => {
            let last = cx.shape(bt).get(2).copied().unwrap_or(0) as i64;
            if last != hkv && last != 1 {
                bail!(Value, "beta's last dim {last} should be {hkv} or 1");
            }
            Some(heads_f32(cx, bt, last)?)
        }
        None => None,
    };
    let state_dtype = match cx.opt(3)? {
        Some(p) => {
            if cx.shape(p) != [b as usize, hkv as usize, dk as usize, dv as usize] {
                bail!(Value, "past_state of shape {:?}", cx.shape(p));
            }
            cx.dtype(p)
        }
        None => out_dtype,
    };
    let mut state = match cx.opt(3)? {
        Some(p) => cast_to(cx, p, DType::F32)?,
        None => cx.call(
            "zeros",
            &[],
            &[
                ("size", list(&[b, hkv, dk, dv])),
                ("dtype", Attr::DType(DType::F32)),
            ],
        )?,
    };
    let scale = match cx.float("scale", 0.0)? {
        0.0 => 1.0 / (dk as f64).sqrt(),
        s => s,
    };
    let group = hq / hkv;
    let step = |cx: &mut Cx, x: ValueId, i: usize| {
        cx.call(
            "select",
            &[Some(x)],
            &[("dim", Attr::Int(2)), ("index", Attr::Int(i as i64))],
        )
    };
    let unsq = |cx: &mut Cx, x: ValueId, d: i64| {
        cx.call("unsqueeze", &[Some(x)], &[("dim", Attr::Int(d))])
    };
    let bin = |cx: &mut Cx, op: &str, a: ValueId, b: ValueId| cx.call(op, &[Some(a), Some(b)], &[]);
    let sc = cx.scalar(scale, DType::F32)?;
    let mut outs = Vec::with_capacity(t);
    for i in 0..t {
        let (qt, kt) = (step(cx, q4, i)?, step(cx, k4, i)?);
        let mut vt = step(cx, v4, i)?;
        if let Some(e) = decay {
            let g = step(cx, e, i)?;
            let g = unsq(cx, g, -1)?;
            state = bin(cx, "mul", state, g)?;
        }
        if let Some(bt) = beta {
            // v - S·k, the value the state already holds for this key
            let kr = unsq(cx, kt, -2)?;
            let got = bin(cx, "matmul", kr, state)?;
            let got = cx.call("squeeze", &[Some(got)], &[("dim", Attr::Int(-2))])?;
            let diff = bin(cx, "sub", vt, got)?;
            let bs = step(cx, bt, i)?;
            vt = bin(cx, "mul", bs, diff)?;
        }
        let kc = unsq(cx, kt, -1)?;
        let vr = unsq(cx, vt, -2)?;
        let outer = bin(cx, "mul", kc, vr)?;
        state = bin(cx, "add", state, outer)?;
        let read = if group == 1 {
            state
        } else {
            let s5 = unsq(cx, state, 2)?;
            let e = cx.call(
                "expand",
                &[Some(s5)],
                &[("size", list(&[b, hkv, group, dk, dv]))],
            )?;
            cx.call("reshape", &[Some(e)], &[("shape", list(&[b, hq, dk, dv]))])?
        };
        let qr = unsq(cx, qt, -2)?;
        let o = bin(cx, "matmul", qr, read)?;
        outs.push(Some(bin(cx, "mul", o, sc)?));
    }
    let out = if outs.is_empty() {
        cx.call(
            "zeros",
            &[],
            &[
                ("size", list(&[b, hq, 0, dv])),
                ("dtype", Attr::DType(DType::F32)),
            ],
        )?
    } else {
        cx.call("cat", &outs, &[("dim", Attr::Int(2))])?
    };
    let out = cx.call("permute", &[Some(out)], &[("dims", list(&[0, 2, 1, 3]))])?;
    let out = cx.call(
        "reshape",
        &[Some(out)],
        &[("shape", list(&[b, t as i64, hq * dv]))],
    )?;
    let out = cast_to(cx, out, out_dtype)?;
    let present = cast_to(cx, state, state_dtype)?;
    Ok(vec![Val::node(out), Val::node(present)])
}
