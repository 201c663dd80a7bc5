//! `RNN`, `GRU` and `LSTM`, unrolled over the sequence (its length is known at import): the
//! input projection of every step is one matmul, then each step is a few small ops.

use super::list;
use crate::ir::attrs::Attr;
use crate::ir::graph::ValueId;
use crate::onnx::import::{Cx, Val};
use crate::{Result, bail};

#[derive(Clone, Copy, PartialEq)]
enum Kind {
    Rnn,
    Gru,
    Lstm,
}

impl Kind {
    /// Gates per cell, the width of W's and R's rows in hidden sizes.
    fn gates(self) -> usize {
        match self {
            Kind::Rnn => 1,
            Kind::Gru => 3,
            Kind::Lstm => 4,
        }
    }

    /// Activations per direction.
    fn defaults(self) -> &'static [&'static str] {
        match self {
            Kind::Rnn => &["Tanh"],
            Kind::Gru => &["Sigmoid", "Tanh"],
            Kind::Lstm => &["Sigmoid", "Tanh", "Tanh"],
        }
    }
}

/// An activation of the recurrent ops' list, with its alpha and beta.
#[derive(Clone)]
struct Act {
    name: String,
    alpha: f64,
    beta: f64,
}

impl Act {
    fn apply(&self, cx: &mut Cx, x: ValueId) -> Result<ValueId> {
        let d = cx.dtype(x);
        let scaled = |cx: &mut Cx, v: ValueId, a: f64| -> Result<ValueId> {
            let s = cx.scalar(a, d)?;
            cx.call("mul", &[Some(v), Some(s)], &[])
        };
        let shifted = |cx: &mut Cx, v: ValueId, b: f64| -> Result<ValueId> {
            let s = cx.scalar(b, d)?;
            cx.call("add", &[Some(v), Some(s)], &[])
        };
        Ok(match self.name.to_ascii_lowercase().as_str() {
            "sigmoid" => cx.call("sigmoid", &[Some(x)], &[])?,
            "tanh" => cx.call("tanh", &[Some(x)], &[])?,
            "relu" => cx.call("relu", &[Some(x)], &[])?,
            "softsign" => {
                let a = cx.call("abs", &[Some(x)], &[])?;
                let p = shifted(cx, a, 1.0)?;
                cx.call("div", &[Some(x), Some(p)], &[])?
            }
            "softplus" => cx.call(
                "softplus",
                &[Some(x)],
                &[("threshold", Attr::Float(f64::INFINITY))],
            )?,
            "leakyrelu" => cx.call(
                "leaky_relu",
                &[Some(x)],
                &[("negative_slope", Attr::Float(self.alpha))],
            )?,
            "elu" => cx.call("elu", &[Some(x)], &[("alpha", Attr::Float(self.alpha))])?,
            "hardsigmoid" => {
                let a = scaled(cx, x, self.alpha)?;
                let b = shifted(cx, a, self.beta)?;
                cx.call(
                    "clamp",
                    &[Some(b)],
                    &[("min", Attr::Float(0.0)), ("max", Attr::Float(1.0))],
                )?
            }
            "affine" => {
                let a = scaled(cx, x, self.alpha)?;
                shifted(cx, a, self.beta)?
            }
            "scaledtanh" => {
                let b = scaled(cx, x, self.beta)?;
                let t = cx.call("tanh", &[Some(b)], &[])?;
                scaled(cx, t, self.alpha)?
            }
            "thresholdedrelu" => {
                let s = cx.scalar(self.alpha, d)?;
                let above = cx.call("gt", &[Some(x), Some(s)], &[])?;
                let zero = cx.scalar(0.0, d)?;
                cx.call("where", &[Some(above), Some(x), Some(zero)], &[])?
            }
            other => bail!(Value, "activation '{other}' is not supported"),
        })
    }
}

/// The activations of each direction, from the node's lists or the op's defaults.
fn activations(cx: &Cx, kind: Kind, dirs: usize) -> Result<Vec<Vec<Act>>> {
    let per = kind.defaults().len();
    let names: Vec<String> = match cx.strings("activations")? {
        Some(v) if !v.is_empty() => v,
        _ => (0..dirs)
            .flat_map(|_| kind.defaults().iter().map(|s| s.to_string()))
            .collect(),
    };
    if names.len() != per * dirs {
        bail!(
            Value,
            "{} activations given, {} expected ({per} per direction)",
            names.len(),
            per * dirs
        );
    }
    let alphas = cx.floats("activation_alpha")?.unwrap_or_default();
    let betas = cx.floats("activation_beta")?.unwrap_or_default();
    let (mut ai, mut bi) = (0, 0);
    let mut acts = Vec::new();
    for name in names {
        let lower = name.to_ascii_lowercase();
        // the defaults of the activations that take parameters
        let (da, db) = match lower.as_str() {
            "leakyrelu" => (0.01, 0.0),
            "thresholdedrelu" | "elu" | "affine" | "scaledtanh" => (1.0, 0.0),
            "hardsigmoid" => (0.2, 0.5),
            _ => (0.0, 0.0),
        };
        let takes_alpha = da != 0.0;
        let takes_beta = matches!(lower.as_str(), "hardsigmoid" | "affine" | "scaledtanh");
        let alpha = if takes_alpha && ai < alphas.len() {
            ai += 1;
            alphas[ai - 1] as f64
        } else {
            da
        };
        let beta = if takes_beta && bi < betas.len() {
            bi += 1;
            betas[bi - 1] as f64
        } else {
            db
        };
        acts.push(Act { name, alpha, beta });
    }
    Ok(acts.chunks(per).map(<[Act]>::to_vec).collect())
}

/// What every step of one direction reads.
struct Weights {
    /// `R` of the direction, transposed: `[hidden, gates·hidden]`.
    rt: ValueId,
    /// `R`'s bias, `[gates·hidden]`, when given.
    rb: Option<ValueId>,
    /// LSTM peepholes (input, output, forget), each `[hidden]`.
    peep: Option<[ValueId; 3]>,
}

fn select(cx: &mut Cx, x: ValueId, dim: i64, index: i64) -> Result<ValueId> {
    cx.call(
        "select",
        &[Some(x)],
        &[("dim", Attr::Int(dim)), ("index", Attr::Int(index))],
    )
}

fn narrow(cx: &mut Cx, x: ValueId, dim: i64, start: usize, len: usize) -> Result<ValueId> {
    cx.call(
        "narrow",
        &[Some(x)],
        &[
            ("dim", Attr::Int(dim)),
            ("start", Attr::Int(start as i64)),
            ("length", Attr::Int(len as i64)),
        ],
    )
}

fn t(cx: &mut Cx, x: ValueId) -> Result<ValueId> {
    cx.call("t", &[Some(x)], &[])
}

fn lower(cx: &mut Cx, kind: Kind) -> Result<Vec<Val>> {
    let (x, w, r) = (cx.x(0)?, cx.x(1)?, cx.x(2)?);
    let b = cx.opt(3)?;
    if cx.rank(x) != 3 || cx.rank(r) != 3 {
        bail!(
            Value,
            "X {:?} and R {:?} must be 3-D",
            cx.shape(x),
            cx.shape(r)
        );
    }
    let hidden = cx.int("hidden_size", 0)?.max(0) as usize;
    let direction = cx.string("direction")?.unwrap_or_else(|| "forward".into());
    let dirs = if direction == "bidirectional" { 2 } else { 1 };
    let layout = cx.int("layout", 0)?;
    let clip = cx.attr("clip").map(|_| cx.float("clip", 0.0)).transpose()?;
    let acts = activations(cx, kind, dirs)?;
    let g = kind.gates();
    if hidden == 0 || cx.shape(w) != [dirs, g * hidden, cx.shape(x)[2]] {
        bail!(
            Value,
            "W of shape {:?} does not fit hidden_size {hidden} and direction '{direction}'",
            cx.shape(w)
        );
    }
    let dtype = cx.dtype(x);
    // the sequence major: [seq, batch, input]
    let x = if layout == 1 {
        cx.call("permute", &[Some(x)], &[("dims", list(&[1, 0, 2]))])?
    } else {
        x
    };
    let (seq, batch) = (cx.shape(x)[0], cx.shape(x)[1]);
    let lens = cx.ints_input(4, "sequence_lens")?;
    let lens = lens.filter(|l| l.iter().any(|&n| n as usize != seq));
    if lens.is_some() && direction != "forward" {
        bail!(
            Value,
            "sequence_lens shorter than the sequence need the forward direction"
        );
    }
    // initial states as [dirs, batch, hidden]
    let state = |cx: &mut Cx, i: usize| -> Result<Option<ValueId>> {
        Ok(match cx.opt(i)? {
            Some(v) if layout == 1 => {
                Some(cx.call("permute", &[Some(v)], &[("dims", list(&[1, 0, 2]))])?)
            }
            other => other,
        })
    };
    let h0 = state(cx, 5)?;
    let c0 = if kind == Kind::Lstm {
        state(cx, 6)?
    } else {
        None
    };
    let p = if kind == Kind::Lstm { cx.opt(7)? } else { None };
    let zeros = |cx: &mut Cx| {
        cx.call(
            "zeros",
            &[],
            &[
                ("size", list(&[batch as i64, hidden as i64])),
                ("dtype", Attr::DType(dtype)),
            ],
        )
    };
    let gh = g * hidden;
    let mut ys = Vec::new();
    let (mut hs, mut cs) = (Vec::new(), Vec::new());
    for (d, acts) in acts.iter().enumerate() {
        let wd = select(cx, w, 0, d as i64)?;
        let wt = t(cx, wd)?;
        let rd = select(cx, r, 0, d as i64)?;
        let rt = t(cx, rd)?;
        // every step's input projection at once: [seq, batch, gates·hidden]
        let mut xw = cx.call("matmul", &[Some(x), Some(wt)], &[])?;
        let mut rb = None;
        if let Some(b) = b {
            let bd = select(cx, b, 0, d as i64)?;
            let wb = narrow(cx, bd, 0, 0, gh)?;
            xw = cx.op("add", &[xw, wb])?;
            rb = Some(narrow(cx, bd, 0, gh, gh)?);
        }
        let peep = match p {
            Some(p) => {
                let pd = select(cx, p, 0, d as i64)?;
                Some([
                    narrow(cx, pd, 0, 0, hidden)?,
                    narrow(cx, pd, 0, hidden, hidden)?,
                    narrow(cx, pd, 0, 2 * hidden, hidden)?,
                ])
            }
            None => None,
        };
        let wts = Weights { rt, rb, peep };
        let mut h = match h0 {
            Some(h0) => select(cx, h0, 0, d as i64)?,
            None => zeros(cx)?,
        };
        let mut c = match (kind, c0) {
            (Kind::Lstm, Some(c0)) => Some(select(cx, c0, 0, d as i64)?),
            (Kind::Lstm, None) => Some(zeros(cx)?),
            _ => None,
        };
        let reverse = direction == "reverse" || d == 1;
        let mut outs: Vec<Option<ValueId>> = vec![None; seq];
        for step in 0..seq {
            let ti = if reverse { seq - 1 - step } else { step };
            let xt = select(cx, xw, 0, ti as i64)?;
            let (hn, cn) = cell(cx, kind, (xt, h, c), &wts, acts, (hidden, clip))?;
            let (hn, cn, y) = match &lens {
                Some(l) => {
                    // past a sequence's end its state holds, and its output is 0
                    let live: Vec<bool> = l.iter().map(|&n| (ti as i64) < n).collect();
                    let m = cx.tensor(&crate::Tensor::from_vec(live, &[batch, 1])?)?;
                    let hk = cx.call("where", &[Some(m), Some(hn), Some(h)], &[])?;
                    let ck = match (cn, c) {
                        (Some(cn), Some(c)) => {
                            Some(cx.call("where", &[Some(m), Some(cn), Some(c)], &[])?)
                        }
                        _ => None,
                    };
                    let z = cx.scalar(0.0, dtype)?;
                    let y = cx.call("where", &[Some(m), Some(hn), Some(z)], &[])?;
                    (hk, ck, y)
                }
                None => (hn, cn, hn),
            };
            h = hn;
            c = cn;
            outs[ti] = Some(y);
        }
        let stacked: Vec<Option<ValueId>> = outs;
        ys.push(if seq == 0 {
            cx.call(
                "zeros",
                &[],
                &[
                    ("size", list(&[0, batch as i64, hidden as i64])),
                    ("dtype", Attr::DType(dtype)),
                ],
            )?
        } else {
            cx.call("stack", &stacked, &[("dim", Attr::Int(0))])?
        });
        hs.push(Some(h));
        cs.push(c);
    }
    // Y: [seq, dirs, batch, hidden]; Y_h, Y_c: [dirs, batch, hidden] (batch first for layout 1)
    let ys: Vec<Option<ValueId>> = ys.into_iter().map(Some).collect();
    let mut y = cx.call("stack", &ys, &[("dim", Attr::Int(1))])?;
    let mut yh = cx.call("stack", &hs, &[("dim", Attr::Int(0))])?;
    let mut yc = match cs.iter().all(Option::is_some) && kind == Kind::Lstm {
        true => Some(cx.call("stack", &cs, &[("dim", Attr::Int(0))])?),
        false => None,
    };
    if layout == 1 {
        y = cx.call("permute", &[Some(y)], &[("dims", list(&[2, 0, 1, 3]))])?;
        yh = cx.call("permute", &[Some(yh)], &[("dims", list(&[1, 0, 2]))])?;
        if let Some(c) = yc {
            yc = Some(cx.call("permute", &[Some(c)], &[("dims", list(&[1, 0, 2]))])?);
        }
    }
    let mut outs = vec![Val::node(y), Val::node(yh)];
    if let Some(c) = yc {
        outs.push(Val::node(c));
    }
    Ok(outs)
}

/// One step: the new hidden state (and cell state for LSTM) from the step's input
/// projection `xt` and the previous states.
fn cell(
    cx: &mut Cx,
    kind: Kind,
    (xt, h, c): (ValueId, ValueId, Option<ValueId>),
    w: &Weights,
    acts: &[Act],
    (hidden, clip): (usize, Option<f64>),
) -> Result<(ValueId, Option<ValueId>)> {
    let clipped = |cx: &mut Cx, v: ValueId| -> Result<ValueId> {
        match clip {
            Some(k) => cx.call(
                "clamp",
                &[Some(v)],
                &[("min", Attr::Float(-k)), ("max", Attr::Float(k))],
            ),
            None => Ok(v),
        }
    };
    let gate = |cx: &mut Cx, v: ValueId, k: usize| narrow(cx, v, 1, k * hidden, hidden);
    match kind {
        Kind::Rnn | Kind::Lstm => {
            let mut hr = cx.call("matmul", &[Some(h), Some(w.rt)], &[])?;
            if let Some(rb) = w.rb {
                hr = cx.op("add", &[hr, rb])?;
            }
            let mut g = cx.op("add", &[xt, hr])?;
            g = clipped(cx, g)?;
            if kind == Kind::Rnn {
                return Ok((acts[0].apply(cx, g)?, None));
            }
            let Some(c) = c else {
                bail!(Value, "LSTM: the step has no cell state");
            };
            let (mut i, mut o, mut f) = (gate(cx, g, 0)?, gate(cx, g, 1)?, gate(cx, g, 2)?);
            let cc = gate(cx, g, 3)?;
            if let Some([pi, _, pf]) = w.peep {
                let a = cx.op("mul", &[pi, c])?;
                i = cx.op("add", &[i, a])?;
                let b = cx.op("mul", &[pf, c])?;
                f = cx.op("add", &[f, b])?;
            }
            let i = acts[0].apply(cx, i)?;
            let f = if cx.int("input_forget", 0)? != 0 {
                let one = cx.scalar(1.0, cx.dtype(i))?;
                cx.op("sub", &[one, i])?
            } else {
                acts[0].apply(cx, f)?
            };
            let ct = acts[1].apply(cx, cc)?;
            let fc = cx.op("mul", &[f, c])?;
            let ic = cx.op("mul", &[i, ct])?;
            let c_new = cx.op("add", &[fc, ic])?;
            if let Some([_, po, _]) = w.peep {
                let a = cx.op("mul", &[po, c_new])?;
                o = cx.op("add", &[o, a])?;
            }
            let o = acts[0].apply(cx, o)?;
            let hc = acts[2].apply(cx, c_new)?;
            Ok((cx.op("mul", &[o, hc])?, Some(c_new)))
        }
        Kind::Gru => {
            let lbr = cx.int("linear_before_reset", 0)? != 0;
            // H Rᵀ for z and r, then for h (after or before the reset)
            let rzr = narrow(cx, w.rt, 1, 0, 2 * hidden)?;
            let rh = narrow(cx, w.rt, 1, 2 * hidden, hidden)?;
            let bias = |cx: &mut Cx, k: usize, len: usize| -> Result<Option<ValueId>> {
                w.rb.map(|rb| narrow(cx, rb, 0, k * hidden, len))
                    .transpose()
            };
            let mut hzr = cx.call("matmul", &[Some(h), Some(rzr)], &[])?;
            if let Some(b) = bias(cx, 0, 2 * hidden)? {
                hzr = cx.op("add", &[hzr, b])?;
            }
            let xz = gate(cx, xt, 0)?;
            let xr = gate(cx, xt, 1)?;
            let xh = gate(cx, xt, 2)?;
            let hz = narrow(cx, hzr, 1, 0, hidden)?;
            let hr = narrow(cx, hzr, 1, hidden, hidden)?;
            let z = cx.op("add", &[xz, hz])?;
            let z = clipped(cx, z)?;
            let z = acts[0].apply(cx, z)?;
            let r = cx.op("add", &[xr, hr])?;
            let r = clipped(cx, r)?;
            let r = acts[0].apply(cx, r)?;
            let bh = bias(cx, 2, hidden)?;
            let hh = if lbr {
                let mut m = cx.call("matmul", &[Some(h), Some(rh)], &[])?;
                if let Some(b) = bh {
                    m = cx.op("add", &[m, b])?;
                }
                cx.op("mul", &[r, m])?
            } else {
                let rhp = cx.op("mul", &[r, h])?;
                let mut m = cx.call("matmul", &[Some(rhp), Some(rh)], &[])?;
                if let Some(b) = bh {
                    m = cx.op("add", &[m, b])?;
                }
                m
            };
            let pre = cx.op("add", &[xh, hh])?;
            let pre = clipped(cx, pre)?;
            let ht = acts[1].apply(cx, pre)?;
            // (1 - z) ht + z h = ht + z (h - ht)
            let diff = cx.op("sub", &[h, ht])?;
            let zd = cx.op("mul", &[z, diff])?;
            Ok((cx.op("add", &[ht, zd])?, None))
        }
    }
}

pub fn rnn(cx: &mut Cx) -> Result<Vec<Val>> {
    lower(cx, Kind::Rnn)
}

pub fn gru(cx: &mut Cx) -> Result<Vec<Val>> {
    lower(cx, Kind::Gru)
}

pub fn lstm(cx: &mut Cx) -> Result<Vec<Val>> {
    lower(cx, Kind::Lstm)
}
