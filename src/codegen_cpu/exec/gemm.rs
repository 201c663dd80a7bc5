//! A 2-D float `matmul` extern called straight on the `gemm` crate with strides and sizes
//! fixed at compile time, writing into a reused result buffer: the eager path re-plans the
//! product and allocates its result on every call, which dominates tiny training steps.
//! The call is the one the eager kernel makes (same sizes, strides, flags and threading
//! rule), so the results are the same.

use crate::ir::dtype::DType;
use crate::ir::op::Op;
use crate::kernel::{BufferId, ExternCall, Schedule, View};
use gemm::Parallelism;

/// Products with at least this many multiply-adds use several threads (the eager kernel's
/// rule, `kernels::linalg::PAR_FLOPS`).
const PAR_FLOPS: usize = 1 << 18;

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

    /// Runs the product.
    ///
    /// # Safety
    /// `a`, `b` and `out` must point at element 0 of the operands' buffers (allocated with
    /// the schedule's dtype and size, the operands' views inside them as the schedule
    /// validation checked), readable and, for `out`, writable with nothing else accessing it.
    pub unsafe fn run(&self, a: *const u8, b: *const u8, out: *mut u8) {
        // SAFETY: as the caller promises.
        unsafe {
            match self.dtype {
                DType::F64 => self.run_typed::<f64>(a, b, out),
                _ => self.run_typed::<f32>(a, b, out),
            }
        }
    }

    unsafe fn run_typed<T: 'static + Copy + num_traits::One>(
        &self,
        a: *const u8,
        b: *const u8,
        out: *mut u8,
    ) {
        let threads = crate::runtime::threads::available();
        let par = if self.m * self.n * self.k >= PAR_FLOPS && threads > 1 {
            Parallelism::Rayon(threads)
        } else {
            Parallelism::None
        };
        let one = T::one();
        // SAFETY: offsets and strides come from views checked against their buffers.
        unsafe {
            gemm::gemm(
                self.m,
                self.n,
                self.k,
                out as *mut T,
                1,
                self.n as isize,
                false,
                (a as *const T).add(self.a.offset),
                self.a.cs,
                self.a.rs,
                (b as *const T).add(self.b.offset),
                self.b.cs,
                self.b.rs,
                one,
                one,
                false,
                false,
                false,
                par,
            )
        }
    }
}
