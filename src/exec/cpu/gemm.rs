//! A 2-D float `matmul` extern called straight on the `gemm` crate with strides and sizes
//! fixed at compile time, writing into a reused result buffer: the eager path re-plans the
//! product and allocates its result on every call, which dominates tiny training steps.
//! The call is the one the eager kernel makes (same sizes, strides, flags and threading
//! rule), so the results are the same.

use crate::ir::dtype::DType;
use crate::ir::op::{BinaryOp, Op};
use crate::ir::shape::{contiguous_strides, numel};
use crate::kernel::{BufferId, Expr, ExternCall, Schedule, Step, ValId, View};

/// One operand: its buffer, element offset and strides.
#[derive(Clone, Debug)]
pub(super) struct Operand {
    pub buffer: BufferId,
    pub offset: usize,
    pub rs: isize,
    pub cs: isize,
}

/// `out[m,n] = a[m,k] · b[k,n]`, all fixed.
#[derive(Clone, Debug)]
pub(super) struct DirectGemm {
    pub dtype: DType,
    pub m: usize,
    pub n: usize,
    pub k: usize,
    pub a: Operand,
    pub b: Operand,
    pub out: BufferId,
}

fn operand(v: &View) -> Option<Operand> {
    Some(Operand {
        buffer: v.buffer,
        offset: v.offset,
        rs: isize::try_from(v.strides[0]).ok()?,
        cs: isize::try_from(v.strides[1]).ok()?,
    })
}

impl DirectGemm {
    /// The direct form of `e`: a non-empty 2-D f32/f64 `matmul` of views of its dtype into
    /// a contiguous result of the product's shape; `None` for anything else.
    pub fn of(s: &Schedule, e: &ExternCall) -> Option<DirectGemm> {
        if e.op != Op::Matmul || e.args.len() != 2 {
            return None;
        }
        let (va, vb) = (&e.args[0], &e.args[1]);
        let out = s.buffers.get(e.out)?;
        let dtype = out.dtype;
        if !matches!(dtype, DType::F32 | DType::F64)
            || va.shape.len() != 2
            || vb.shape.len() != 2
            || va.strides.len() != 2
            || vb.strides.len() != 2
            || s.buffers.get(va.buffer)?.dtype != dtype
            || s.buffers.get(vb.buffer)?.dtype != dtype
        {
            return None;
        }
        let (m, k, n) = (va.shape[0], va.shape[1], vb.shape[1]);
        if vb.shape[0] != k || out.shape != [m, n] || m == 0 || n == 0 || k == 0 {
            return None;
        }
        Some(DirectGemm {
            dtype,
            m,
            n,
            k,
            a: operand(va)?,
            b: operand(vb)?,
            out: e.out,
        })
    }

    /// Runs the product: `out = a·b`, or with `update = Some(beta)`, `out += beta·(a·b)`
    /// (`out` holding the value to update).
    ///
    /// # Safety
    /// `a`, `b` and `out` must point at element 0 of the operands' buffers (allocated with
    /// the schedule's dtype and size, the operands' views inside them as the schedule
    /// validation checked), readable and, for `out`, writable with nothing else accessing it.
    pub unsafe fn run(&self, a: *const u8, b: *const u8, out: *mut u8, update: Option<f64>) {
        // SAFETY: as the caller promises.
        unsafe {
            match self.dtype {
                DType::F64 => self.run_typed::<f64>(a, b, out, update),
                _ => self.run_typed::<f32>(a, b, out, update.map(|x| x as f32)),
            }
        }
    }

    unsafe fn run_typed<T: smelt_rt::gemm::GemmElem>(
        &self,
        a: *const u8,
        b: *const u8,
        out: *mut u8,
        update: Option<T>,
    ) {
        let product = smelt_rt::gemm::Product {
            m: self.m,
            n: self.n,
            k: self.k,
            a: (self.a.rs, self.a.cs),
            b: (self.b.rs, self.b.cs),
        };
        let ptrs = (a as *const T, b as *const T, out as *mut T);
        let offs = [[0, self.a.offset, self.b.offset]];
        let threads = crate::runtime::threads::available();
        // SAFETY: offsets and strides come from views checked against their buffers.
        unsafe { smelt_rt::gemm::batches(&product, ptrs, &offs, update, threads) }
    }
}

/// The step after a direct GEMM computing `out = w + beta·g` from the GEMM's result `g`
/// (which nothing else reads) and a graph input `w`, element by element: SGD's
/// `w - lr·grad`. When `out` is written into `w`'s own storage (`call_into`), the GEMM
/// accumulates into it (`w += beta·(a·b)`, one gemm call reading and writing `w`) and the
/// step is skipped: no gradient buffer is written and read again, no update pass runs.
#[derive(Clone, Debug, PartialEq)]
pub(super) struct Update {
    /// The kernel step this replaces (the one after the GEMM).
    pub step: usize,
    pub out: BufferId,
    pub w: BufferId,
    pub beta: f64,
}

impl Update {
    /// The update that step `step + 1` of `s` applies to the result of GEMM `g` at `step`.
    pub fn of(s: &Schedule, step: usize, g: &DirectGemm) -> Option<Update> {
        let Some(Step::Kernel(k)) = s.steps.get(step + 1) else {
            return None;
        };
        let [st] = &k.stores[..] else {
            return None;
        };
        let whole = crate::kernel::IndexMap {
            strides: contiguous_strides(&k.outer),
            offset: 0,
        };
        let out = &s.buffers[st.buffer];
        if !k.inner.is_empty()
            || !k.passes.is_empty()
            || st.map != whole
            || out.dtype != g.dtype
            || out.shape != [g.m, g.n]
            || numel(&k.outer) != g.m * g.n
        {
            return None;
        }
        let load = |v: ValId| match &k.values[v].expr {
            Expr::Load { buffer, map } if *map == whole => Some(*buffer),
            _ => None,
        };
        let constant = |v: ValId| match k.values[v].expr {
            Expr::Const(c) => Some(c.to_f64()),
            _ => None,
        };
        // out = w ± g·c (or c·g)
        let (w, scaled, sign) = match k.values[st.value].expr {
            Expr::Binary(BinaryOp::Sub, x, y) => (x, y, -1.0),
            Expr::Binary(BinaryOp::Add, x, y) if load(x).is_none() => (y, x, 1.0),
            Expr::Binary(BinaryOp::Add, x, y) => (x, y, 1.0),
            _ => return None,
        };
        let Expr::Binary(BinaryOp::Mul, p, q) = k.values[scaled].expr else {
            return None;
        };
        let c = if load(p) == Some(g.out) {
            constant(q)?
        } else if load(q) == Some(g.out) {
            constant(p)?
        } else {
            return None;
        };
        let w = load(w)?;
        let read_elsewhere = s.outputs.iter().any(|o| o.buffer == g.out)
            || s.steps
                .iter()
                .enumerate()
                .any(|(i, st)| i != step + 1 && super::plan::step_buffers(st).0.contains(&g.out));
        if read_elsewhere
            || !s.inputs.contains(&w)
            || w == g.out
            || w == g.a.buffer
            || w == g.b.buffer
            || s.buffers[w].dtype != g.dtype
        {
            return None;
        }
        Some(Update {
            step: step + 1,
            out: st.buffer,
            w,
            beta: sign * c,
        })
    }
}
