//! Streamed stores. A plain store to a line that is not in cache first reads the line from
//! memory to own it, so a kernel writing a large output moves each output byte twice: a
//! copy-like kernel pays a third more traffic than a copy. Where an innermost vector loop
//! stores into a large contiguous f32 output, it runs in strips of [`STRIP`] elements whose
//! stores land in a stack row (L1), and a native helper ([`vmath::stream`]) moves each row to
//! the output with non-temporal stores, which skip that read and bypass the caches. Only
//! outputs of [`STREAM_MIN_BYTES`] or more stream: a smaller one would still be in cache when
//! the next kernel reads it. The runtime fences after each call of a kernel that streams
//! ([`super::lower::CpuKernel::run_rows`]), so its results are visible once it returns.

use super::generator::{Body, Gen};
use super::strip::{STRIP, STRIP_STACK_BYTES};
use super::vmath;
use crate::Result;
use crate::ir::dtype::DType;
use crate::kernel::Expr;
use cranelift_codegen::ir::{InstBuilder, Value};
use cranelift_frontend::Variable;

/// Bytes from which an f32 output is written by streamed stores: well past the 2 MiB L2 of
/// a core, where the next kernel would read the output back from memory anyway.
pub const STREAM_MIN_BYTES: usize = 8 << 20;

const ROW_BYTES: usize = STRIP as usize * 4;

impl Gen<'_, '_, '_> {
    /// The stores of `body` to stream: each the only store into a contiguous f32 output of
    /// at least the threshold's size that the kernel never reads, within the stack budget.
    pub(super) fn stream_stores(&self, body: &Body) -> Vec<usize> {
        if !vmath::available() || self.pos.is_some() || self.lane_stride.is_some() {
            return vec![];
        }
        let min = self.opts.stream_min_bytes.unwrap_or(STREAM_MIN_BYTES);
        let room = STRIP_STACK_BYTES.saturating_sub(self.strip_rows_bytes) / ROW_BYTES;
        let k = self.k;
        body.stores
            .iter()
            .copied()
            .filter(|&s| {
                let b = k.stores[s].buffer;
                let buf = &self.bufs[b];
                let read = k
                    .values
                    .iter()
                    .any(|v| matches!(v.expr, Expr::Load { buffer, .. } if buffer == b));
                let once = body
                    .stores
                    .iter()
                    .filter(|&&t| k.stores[t].buffer == b)
                    .count()
                    == 1;
                buf.dtype == DType::F32
                    && buf.len() * 4 >= min
                    && self.cur_stride[self.access_of_store[s]] == 1
                    && !read
                    && once
            })
            .take(room)
            .collect()
    }

    /// The innermost loop over `[0, len)` in strips whose `stores` go through stack rows
    /// streamed to their outputs (`i` is the loop's index variable).
    pub(super) fn stream_loop(
        &mut self,
        i: Variable,
        len: Value,
        body: &Body,
        env: &mut [Option<Value>],
        stores: &[usize],
    ) -> Result<()> {
        let accs: Vec<usize> = stores.iter().map(|&s| self.access_of_store[s]).collect();
        let rows: Vec<Value> = accs
            .iter()
            .map(|_| {
                self.strip_rows_bytes += ROW_BYTES;
                self.stack_row(ROW_BYTES)
            })
            .collect();
        self.in_strips(len, STRIP, &mut |g, sv, n, end| {
            // the stores of elements [sv, end) land in the rows: element `sv` at a row's start
            let back = g.fb.b.ins().imul_imm_s(sv, 4);
            let mut outs = Vec::with_capacity(accs.len());
            for (&a, &row) in accs.iter().zip(&rows) {
                outs.push((g.pointer_at(a, sv), g.cur_ptr[a]));
                g.cur_ptr[a] = Some(g.fb.b.ins().isub(row, back));
            }
            g.fb.b.def_var(i, sv);
            g.vector_loop(i, end, body, env)?;
            g.scalar_loop(i, end, body, env)?;
            for ((&a, &row), (dst, ptr)) in accs.iter().zip(&rows).zip(outs) {
                g.cur_ptr[a] = ptr;
                g.call_void(vmath::STREAM_SYMBOL, &[row, dst, n]);
            }
            Ok(())
        })
    }
}
