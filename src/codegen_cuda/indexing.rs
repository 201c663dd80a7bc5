//! CUDA kernels for the data-movement ops that the fusion pass leaves as extern calls: `cat`,
//! `stack`, `repeat`, `flip`, `tril`/`triu`, `index_select`, `gather`, `embedding` and the
//! scatters. One thread per output element (grid-stride) finds the element it copies through
//! the operands' strided views. An index outside its dim sets the error flag to [`INDEX_ERROR`] and leaves
//! the element unwritten; the runtime then asks the CPU kernels for PyTorch's message.
//!
//! `scatter`, `scatter_add` and `index_add` run as gathers (`Body::scatter`) where each
//! output element scans at most `MAX_SCAN` index entries: deterministic, the CPU kernels'
//! results bit for bit. Longer scans run as two kernels, a copy of `x` and then one thread per
//! index entry storing or adding (atomically) its `src` element into the output
//! (`scatter_atomic`): as in PyTorch, sums then come in any order and a plain scatter with
//! duplicate indices keeps any one of their values. `scaled_dot_product_attention` runs one
//! thread per output element with an online softmax (`Body::attention`). The convolutional
//! family (convolutions, pooling, their gradients, `dropout`) is dispatched here too, its
//! bodies written in `codegen_cuda::cnn`. `einsum` and the GEMMs stay with the runtime.

use super::scalar::{self, var_type};
use super::{CudaKernelSrc, KernelParam, Launch, ParamAccess};
use crate::Result;
use crate::ir::dtype::DType;
use crate::ir::op::{BinaryOp, Op};
use crate::ir::shape::{contiguous_strides, numel, wrap_dim, wrap_dims};
use crate::kernel::{ExternCall, Schedule, View};
use std::fmt::Write;

/// The value a kernel writes to its error flag when an index is out of range.
pub const INDEX_ERROR: u32 = 2;

const BLOCK: u32 = 256;
const MAX_GRID: u64 = 1 << 16;

/// The element address of view `v` at positions `pos` (C expressions, one per dim).
pub(super) fn addr(v: &View, pos: &[String]) -> String {
    let mut terms: Vec<String> = v
        .strides
        .iter()
        .zip(&v.shape)
        .zip(pos)
        .filter(|&((&st, &n), _)| st != 0 && n > 1)
        .map(|((&st, _), p)| {
            if st == 1 {
                p.clone()
            } else {
                format!("{st}LL*{p}")
            }
        })
        .collect();
    if v.offset != 0 || terms.is_empty() {
        terms.push(format!("{}LL", v.offset));
    }
    terms.join(" + ")
}

/// Builds a kernel's body line by line.
pub(super) struct Body<'a> {
    /// The schedule.
    pub(super) s: &'a Schedule,
    /// The extern call the kernel computes.
    pub(super) e: &'a ExternCall,
    /// The result's dtype.
    pub(super) out: DType,
    text: String,
}

impl<'a> Body<'a> {
    fn new(s: &'a Schedule, e: &'a ExternCall) -> Body<'a> {
        Body {
            s,
            e,
            out: s.buffers[e.out].dtype,
            text: String::new(),
        }
    }

    pub(super) fn line(&mut self, indent: usize, t: &str) {
        let _ = writeln!(self.text, "{}{t}", "  ".repeat(indent));
    }

    /// Stores argument `arg`'s element at positions `pos` to the output, cast to its dtype.
    fn copy(&mut self, indent: usize, arg: usize, pos: &[String]) {
        let v = &self.e.args[arg];
        let d = self.s.buffers[v.buffer].dtype;
        let x = scalar::load(d, &format!("b{}[{}]", v.buffer, addr(v, pos)));
        let x = scalar::cast(d, self.out, &format!("(({})({x}))", var_type(d)));
        let st = scalar::store(self.out, &x);
        self.line(indent, &format!("sm_out[sm_i] = {st};"));
    }

    /// Reads index tensor `arg` at `pos` into `sm_v` and checks `0 <= sm_v < size`.
    fn index(&mut self, indent: usize, arg: usize, pos: &[String], size: usize) {
        let v = &self.e.args[arg];
        let a = addr(v, pos);
        self.line(
            indent,
            &format!("const long long sm_v = (long long)b{}[{a}];", v.buffer),
        );
        self.line(
            indent,
            &format!("if (sm_v < 0 || sm_v >= {size}LL) {{ *sm_err = {INDEX_ERROR}u; continue; }}"),
        );
    }
}

/// Longest run of index entries one output element of a scatter scans; longer ones stay
/// with the runtime.
const MAX_SCAN: usize = 256;

impl Body<'_> {
    /// Attention, one thread per output element `(.., i, c)`: the row's scores computed as
    /// the keys go by, with the online-softmax recurrence (running maximum `sm_m`, running
    /// sum `sm_l`, running weighted value `sm_acc`), so nothing of size `[L, S]` is stored.
    /// Floats compute in f32 (halves too), doubles in f64; a row whose every key is masked
    /// out gives 0, as the CPU kernel.
    fn attention(&mut self, rank: usize, has_mask: bool, causal: bool, scale: f64, p: &[String]) {
        let (q, k, v) = (&self.e.args[0], &self.e.args[1], &self.e.args[2]);
        let dq = self.s.buffers[q.buffer].dtype;
        let wide = dq == DType::F64;
        let t = if wide { "double" } else { "float" };
        let (exp, neg_inf) = if wide {
            ("exp", "(-SM_INF_D)")
        } else {
            ("expf", "(-SM_INF_F)")
        };
        let (e, s) = (q.shape[rank - 1], k.shape[rank - 2]);
        let batch: Vec<String> = p[..rank - 2].to_vec();
        let at = |extra: [&str; 2]| {
            let mut v = batch.clone();
            v.extend(extra.iter().map(|x| x.to_string()));
            v
        };
        let ld = |view: &View, pos: &[String]| {
            let d = self.s.buffers[view.buffer].dtype;
            let x = scalar::load(d, &format!("b{}[{}]", view.buffer, addr(view, pos)));
            format!("(({t})({x}))")
        };
        let (i, c) = (p[rank - 2].clone(), p[rank - 1].clone());
        let qv = ld(q, &at([&i, "sm_t"]));
        let kv = ld(k, &at(["sm_j", "sm_t"]));
        let vv = ld(v, &at(["sm_j", &c]));
        let mask = has_mask.then(|| {
            let m = &self.e.args[3];
            // the mask's dims align with the scores' from the right
            let full = at([&i, "sm_j"]);
            let pos = full[full.len() - m.shape.len()..].to_vec();
            (self.s.buffers[m.buffer].dtype, m.buffer, addr(m, &pos))
        });
        self.line(2, &format!("{t} sm_m = {neg_inf}, sm_l = 0, sm_acc = 0;"));
        self.line(
            2,
            &format!("for (long long sm_j = 0; sm_j < {s}LL; ++sm_j) {{"),
        );
        if causal {
            self.line(3, &format!("if (sm_j > {i}) break;"));
        }
        if let Some((DType::Bool, buf, a)) = &mask {
            self.line(3, &format!("if (!b{buf}[{a}]) continue;"));
        }
        self.line(3, &format!("{t} sm_s = 0;"));
        self.line(
            3,
            &format!("for (long long sm_t = 0; sm_t < {e}LL; ++sm_t) sm_s += {qv} * {kv};"),
        );
        self.line(3, &format!("sm_s *= ({t}){scale:?};"));
        if let Some((d, buf, a)) = &mask
            && *d != DType::Bool
        {
            let x = scalar::load(*d, &format!("b{buf}[{a}]"));
            self.line(3, &format!("sm_s += ({t})({x});"));
        }
        self.line(3, &format!("if (sm_s == {neg_inf}) continue;"));
        self.line(3, &format!("const {t} sm_x = {vv};"));
        self.line(3, "if (sm_s > sm_m) {");
        self.line(
            4,
            &format!("const {t} sm_c = sm_m == {neg_inf} ? ({t})0 : {exp}(sm_m - sm_s);"),
        );
        self.line(
            4,
            "sm_l = sm_l * sm_c + 1; sm_acc = sm_acc * sm_c + sm_x; sm_m = sm_s;",
        );
        self.line(3, "} else {");
        self.line(4, &format!("const {t} sm_p = {exp}(sm_s - sm_m);"));
        self.line(4, "sm_l += sm_p; sm_acc += sm_p * sm_x;");
        self.line(3, "}");
        self.line(2, "}");
        let r = format!("(sm_l == 0 ? ({t})0 : sm_acc / sm_l)");
        let st = scalar::store(self.out, &format!("(({})({r}))", var_type(self.out)));
        self.line(2, &format!("sm_out[sm_i] = {st};"));
    }

    /// `scatter`, `scatter_add` (operands x, index, src) and `index_add` (x, 1-d index, src)
    /// written as gathers, so that no two threads write one element: each output element
    /// starts from `x` and scans, in order, the `span` index entries that can land on it
    /// (along dim `d`). The writes and sums then happen in the CPU kernels' order, and the
    /// results are theirs bit for bit. Every index entry is scanned by some thread, so every
    /// bad one raises the flag.
    fn scatter(&mut self, op: &Op, d: usize, span: usize, p: &[String]) -> Result<()> {
        let (x, idx, src) = (&self.e.args[0], &self.e.args[1], &self.e.args[2]);
        let out = self.out;
        let t = var_type(out);
        let ld = |v: &View, pos: &[String]| {
            scalar::load(out, &format!("b{}[{}]", v.buffer, addr(v, pos)))
        };
        self.line(2, &format!("{t} sm_acc = {};", ld(x, p)));
        let index_add = matches!(op, Op::IndexAdd { .. });
        // an index entry exists at this output's other positions
        if !index_add {
            let inside: Vec<String> = (0..p.len())
                .filter(|&k| k != d && idx.shape[k] < x.shape[k])
                .map(|k| format!("p{k} < {}LL", idx.shape[k]))
                .collect();
            if !inside.is_empty() {
                self.line(2, &format!("if ({}) {{", inside.join(" && ")));
            } else {
                self.line(2, "{");
            }
        } else {
            self.line(2, "{");
        }
        self.line(
            3,
            &format!("for (long long sm_t = 0; sm_t < {span}LL; ++sm_t) {{"),
        );
        let mut q = p.to_vec();
        q[d] = "sm_t".into();
        let at = if index_add {
            if idx.shape.is_empty() {
                vec![]
            } else {
                vec!["sm_t".to_string()]
            }
        } else {
            q.clone()
        };
        self.line(
            4,
            &format!(
                "const long long sm_v = (long long)b{}[{}];",
                idx.buffer,
                addr(idx, &at)
            ),
        );
        let size = x.shape[d];
        self.line(
            4,
            &format!("if (sm_v < 0 || sm_v >= {size}LL) {{ *sm_err = {INDEX_ERROR}u; break; }}"),
        );
        let s = ld(src, &q);
        let next = if matches!(op, Op::Scatter { .. }) {
            s
        } else {
            scalar::binary(BinaryOp::Add, out, "sm_acc", &s)?
        };
        self.line(4, &format!("if (sm_v == p{d}) sm_acc = {next};"));
        self.line(3, "}");
        self.line(2, "}");
        self.line(
            2,
            &format!("sm_out[sm_i] = {};", scalar::store(out, "sm_acc")),
        );
        Ok(())
    }
}

/// `scatter`, `scatter_add` or `index_add` along dim `d` as two kernels: `out = x`, then one
/// thread per index entry (per `src` element for `index_add`) checking its index and storing
/// or atomically adding its `src` element. Adds of dtypes without atomics stay with the
/// runtime.
fn scatter_atomic(
    s: &Schedule,
    e: &ExternCall,
    d: usize,
    fn_name: &str,
) -> Result<Vec<CudaKernelSrc>> {
    let out = &s.buffers[e.out];
    let add = !matches!(e.op, Op::Scatter { .. });
    let (x, idx, src) = (&e.args[0], &e.args[1], &e.args[2]);
    let rank = out.shape.len();
    let p: Vec<String> = (0..rank).map(|k| format!("p{k}")).collect();
    let dense = View {
        buffer: e.out,
        shape: out.shape.clone(),
        strides: contiguous_strides(&out.shape),
        offset: 0,
    };
    let mut q = p.clone();
    q[d] = "sm_v".into();
    let at = addr(&dense, &q);
    let v = scalar::load(out.dtype, &format!("b{}[{}]", src.buffer, addr(src, &p)));
    let v = format!("(({})({v}))", var_type(out.dtype));
    let update = match (add, out.dtype) {
        (false, d) => format!("sm_out[{at}] = {};", scalar::store(d, &v)),
        (true, DType::F32 | DType::F64 | DType::I32) => format!("atomicAdd(&sm_out[{at}], {v});"),
        (true, DType::I64) => {
            format!("atomicAdd((unsigned long long*)&sm_out[{at}], (unsigned long long)({v}));")
        }
        (true, d @ (DType::F16 | DType::BF16)) => {
            format!("atomicAdd(&sm_out[{at}], {});", scalar::store(d, &v))
        }
        _ => return Ok(vec![]),
    };

    let mut copy = Body::new(s, e);
    copy.copy(2, 0, &p);
    let copy = copy.assemble(&format!("{fn_name}_copy"), &out.shape, ParamAccess::Write);

    let (walk, at) = if matches!(e.op, Op::IndexAdd { .. }) {
        let at = if idx.shape.is_empty() {
            vec![]
        } else {
            vec![p[d].clone()]
        };
        (&src.shape, at)
    } else {
        (&idx.shape, p.clone())
    };
    let mut b = Body::new(s, e);
    b.index(2, 1, &at, x.shape[d]);
    b.line(2, &update);
    Ok(vec![
        copy,
        b.assemble(fn_name, walk, ParamAccess::ReadWrite),
    ])
}

/// The CUDA kernels of extern call `e` of `s`, run in order; none when the runtime serves
/// the op.
pub fn kernels(s: &Schedule, e: &ExternCall, fn_name: &str) -> Result<Vec<CudaKernelSrc>> {
    let out = &s.buffers[e.out];
    let shape = &out.shape;
    let rank = shape.len();
    let p: Vec<String> = (0..rank).map(|d| format!("p{d}")).collect();
    let mut b = Body::new(s, e);
    let a = &e.args;
    match &e.op {
        Op::Repeat { .. } => {
            let x = &a[0];
            let lead = rank - x.shape.len();
            let pos: Vec<String> = x
                .shape
                .iter()
                .enumerate()
                .map(|(i, &n)| format!("(p{} % {n}LL)", lead + i))
                .collect();
            b.copy(2, 0, &pos);
        }
        Op::Flip { dims } => {
            let flip = wrap_dims(dims, rank)?;
            let pos: Vec<String> = (0..rank)
                .map(|d| {
                    if flip.contains(&d) {
                        format!("({}LL - p{d})", shape[d] as i64 - 1)
                    } else {
                        p[d].clone()
                    }
                })
                .collect();
            b.copy(2, 0, &pos);
        }
        Op::Tril { diagonal } | Op::Triu { diagonal } => {
            let (r, c) = (&p[rank - 2], &p[rank - 1]);
            let keep = if matches!(e.op, Op::Tril { .. }) {
                format!("{c} - {r} <= {diagonal}LL")
            } else {
                format!("{c} - {r} >= {diagonal}LL")
            };
            b.line(2, &format!("if (!({keep})) {{"));
            let zero = scalar::store(out.dtype, &scalar::cast(DType::Bool, out.dtype, "false"));
            b.line(3, &format!("sm_out[sm_i] = {zero};"));
            b.line(3, "continue;");
            b.line(2, "}");
            b.copy(2, 0, &p);
        }
        Op::Cat { dim } => {
            let d = wrap_dim(*dim, rank)?;
            b.line(2, &format!("long long sm_c = p{d};"));
            for (k, v) in a.iter().enumerate() {
                // legacy empty 1-d operands and empty parts hold nothing
                if v.shape.len() != rank || v.shape[d] == 0 {
                    continue;
                }
                let n = v.shape[d];
                let mut pos = p.clone();
                pos[d] = "sm_c".into();
                b.line(2, &format!("if (sm_c < {n}LL) {{"));
                b.copy(3, k, &pos);
                b.line(3, "continue;");
                b.line(2, "}");
                b.line(2, &format!("sm_c -= {n}LL;"));
            }
        }
        Op::Stack { dim } => {
            let d = wrap_dim(*dim, rank)?;
            let mut pos = p.clone();
            pos.remove(d);
            for k in 0..a.len() {
                b.line(2, &format!("if (p{d} == {k}LL) {{"));
                b.copy(3, k, &pos);
                b.line(2, "}");
            }
        }
        Op::IndexSelect { dim } => {
            let x = &a[0];
            if x.shape.is_empty() {
                return Ok(vec![]);
            }
            let d = wrap_dim(*dim, x.shape.len())?;
            let at = if a[1].shape.is_empty() {
                vec![]
            } else {
                vec![p[d].clone()]
            };
            b.index(2, 1, &at, x.shape[d]);
            let mut pos = p.clone();
            pos[d] = "sm_v".into();
            b.copy(2, 0, &pos);
        }
        Op::Gather { dim } => {
            let x = &a[0];
            if x.shape.is_empty() {
                return Ok(vec![]);
            }
            let d = wrap_dim(*dim, rank)?;
            b.index(2, 1, &p, x.shape[d]);
            let mut pos = p.clone();
            pos[d] = "sm_v".into();
            b.copy(2, 0, &pos);
        }
        Op::Scatter { dim } | Op::ScatterAdd { dim } | Op::IndexAdd { dim } => {
            let d = wrap_dim(*dim, rank.max(1))?;
            let idx = &a[1];
            let index_add = matches!(e.op, Op::IndexAdd { .. });
            // (with no output element to scan them, bad indices would go unseen)
            let unseen = a[0].shape.get(d) == Some(&0) && numel(&idx.shape) > 0;
            if rank == 0 || (!index_add && idx.shape.len() != rank) {
                return Ok(vec![]);
            }
            let span = if index_add {
                idx.shape.iter().product()
            } else {
                idx.shape[d]
            };
            if span > MAX_SCAN || unseen {
                return scatter_atomic(s, e, d, fn_name);
            }
            b.scatter(&e.op, d, span, &p)?;
        }
        Op::Attention {
            has_mask,
            is_causal,
            scale,
        } => {
            if rank < 2 {
                return Ok(vec![]);
            }
            let scale = scale.map_or(1.0 / (a[0].shape[rank - 1] as f64).sqrt(), |s| s.get());
            b.attention(rank, *has_mask, *is_causal, scale, &p);
        }
        Op::Embedding => {
            let w = &a[1];
            b.index(2, 0, &p[..rank - 1], w.shape[0]);
            b.copy(2, 1, &["sm_v".to_string(), p[rank - 1].clone()]);
        }
        // the convolutional family (`cnn`): false leaves the op to the runtime
        Op::Conv { conv, has_bias } => {
            if !b.conv(conv, *has_bias, &p)? {
                return Ok(vec![]);
            }
        }
        Op::ConvInputGrad { conv, .. } => {
            if !b.conv_input_grad(conv, &p)? {
                return Ok(vec![]);
            }
        }
        Op::ConvWeightGrad { conv, weight_size } => {
            if !b.conv_weight_grad(conv, weight_size, &p)? {
                return Ok(vec![]);
            }
        }
        Op::MaxPool2d { pool } => {
            if !b.max_pool(pool, &p)? {
                return Ok(vec![]);
            }
        }
        Op::MaxPool2dGrad { pool } => {
            if !b.max_pool_grad(pool, &p)? {
                return Ok(vec![]);
            }
        }
        Op::AvgPool2d {
            pool,
            count_include_pad,
        } => {
            if !b.avg_pool(pool, *count_include_pad, &p)? {
                return Ok(vec![]);
            }
        }
        Op::AvgPool2dGrad {
            pool,
            count_include_pad,
            ..
        } => {
            if !b.avg_pool_grad(pool, *count_include_pad, &p)? {
                return Ok(vec![]);
            }
        }
        Op::AdaptiveAvgPool2d { .. } => {
            if !b.adaptive_pool(&p)? {
                return Ok(vec![]);
            }
        }
        Op::AdaptiveAvgPool2dGrad { .. } => {
            if !b.adaptive_pool_grad(&p)? {
                return Ok(vec![]);
            }
        }
        Op::Dropout {
            p: prob,
            training,
            seed,
        } => {
            if !b.dropout(prob.get(), *training, *seed, &p)? {
                return Ok(vec![]);
            }
        }
        _ => return Ok(vec![]),
    }

    Ok(vec![b.assemble(fn_name, shape, ParamAccess::Write)])
}

impl Body<'_> {
    /// The grid-stride kernel `fn_name` running the body once per element of `shape`
    /// (positions `p0`, `p1`, ...); its parameters are the operands' buffers, the output
    /// (used as `access` says) and the error flag.
    fn assemble(self, fn_name: &str, shape: &[usize], access: ParamAccess) -> CudaKernelSrc {
        let (s, e) = (self.s, self.e);
        let out = &s.buffers[e.out];
        let a = &e.args;
        // parameters: each operand buffer once, then the output and the flag
        let mut bufs: Vec<usize> = Vec::new();
        for v in a {
            if !bufs.contains(&v.buffer) {
                bufs.push(v.buffer);
            }
        }
        let mut params = Vec::new();
        let mut sig = Vec::new();
        for &buf in &bufs {
            let ty = scalar::mem_type(s.buffers[buf].dtype);
            sig.push(format!("const {ty}* __restrict__ b{buf}"));
            params.push(KernelParam {
                name: format!("b{buf}"),
                buffer: Some(buf),
                ctype: format!("const {ty}*"),
                access: ParamAccess::Read,
            });
        }
        let oty = scalar::mem_type(out.dtype);
        sig.push(format!("{oty}* __restrict__ sm_out"));
        params.push(KernelParam {
            name: "sm_out".into(),
            buffer: Some(e.out),
            ctype: format!("{oty}*"),
            access,
        });
        sig.push("unsigned int* __restrict__ sm_err".into());
        params.push(KernelParam {
            name: "sm_err".into(),
            buffer: None,
            ctype: "unsigned int*".into(),
            access: ParamAccess::ErrorFlag,
        });

        let n = numel(shape) as u64;
        let mut src = String::new();
        let _ = writeln!(src, "/* {} */", e.op.name());
        let _ = writeln!(
            src,
            "extern \"C\" __global__ void __launch_bounds__({BLOCK}) {fn_name}({}) {{",
            sig.join(", ")
        );
        let _ = writeln!(src, "  (void)sm_err;");
        let _ = writeln!(
            src,
            "  for (long long sm_i = (long long)blockIdx.x * blockDim.x + threadIdx.x; sm_i < {n}LL; sm_i += (long long)gridDim.x * blockDim.x) {{"
        );
        // the output's positions, by div/mod of the flat index
        let _ = writeln!(src, "    long long sm_r = sm_i;");
        for d in (0..shape.len()).rev() {
            let _ = writeln!(src, "    const long long p{d} = sm_r % {}LL;", shape[d]);
            let _ = writeln!(src, "    sm_r /= {}LL;", shape[d]);
            let _ = writeln!(src, "    (void)p{d};");
        }
        src.push_str(&self.text);
        src.push_str("  }\n}\n");
        let uses_half = bufs
            .iter()
            .chain([&e.out])
            .any(|&x| matches!(s.buffers[x].dtype, DType::F16 | DType::BF16));
        CudaKernelSrc {
            name: fn_name.to_string(),
            ir_name: e.op.name().to_string(),
            source: src,
            params,
            launch: Launch::Pointwise {
                n,
                block: BLOCK,
                grid: n.div_ceil(BLOCK as u64).min(MAX_GRID),
            },
            uses_half,
        }
    }
}
