//! Checks of a kernel that do not depend on a backend, so that the Cranelift and CUDA
//! backends accept and refuse the same kernels: [`check_kernel`] checks a kernel against its
//! schedule's buffers (ids, SSA order, passes, maps inside their buffers), [`check_ops`]
//! against the dtype rules of the op set.

use super::{Buffer, BufferId, Expr, IndexMap, Kernel, Level, ValId, buffer_in};
use crate::ir::dtype::DType;
use crate::ir::op::{BinaryOp, Op};
use crate::runtime::{Tensor, apply};
use crate::{Result, bail};

/// The pass of every reduction value; each `Reduce` must be in exactly one pass.
fn pass_of(k: &Kernel) -> Result<std::collections::HashMap<ValId, usize>> {
    let mut pass_of = std::collections::HashMap::new();
    for (p, vs) in k.passes.iter().enumerate() {
        for &r in vs {
            if !matches!(k.values.get(r).map(|v| &v.expr), Some(Expr::Reduce { .. })) {
                bail!(
                    Value,
                    "kernel {}: pass {p} lists v{r}, not a reduction",
                    k.name
                );
            }
            if pass_of.insert(r, p).is_some() {
                bail!(Value, "kernel {}: v{r} is in two passes", k.name);
            }
        }
    }
    let reduces = k
        .values
        .iter()
        .filter(|v| matches!(v.expr, Expr::Reduce { .. }))
        .count();
    if reduces != pass_of.len() {
        bail!(Value, "kernel {}: a reduction is in no pass", k.name);
    }
    Ok(pass_of)
}

fn check_map(buffers: &[Buffer], k: &Kernel, b: BufferId, map: &IndexMap) -> Result<()> {
    let space = k.space();
    if map.strides.len() != space.len() {
        bail!(
            Value,
            "kernel {}: an index map has {} strides for a {}-d space",
            k.name,
            map.strides.len(),
            space.len()
        );
    }
    if map.extent(&space) > buffer_in(buffers, b)?.len() {
        bail!(Value, "kernel {}: an index map leaves buffer b{b}", k.name);
    }
    Ok(())
}

/// Checks kernel `k` against the buffers of its schedule: every load and store inside its
/// buffer with the buffer's dtype, values in order, passes well formed.
pub fn check_kernel(k: &Kernel, buffers: &[Buffer]) -> Result<()> {
    let n = k.values.len();
    for (i, v) in k.values.iter().enumerate() {
        if v.expr.operands().iter().any(|&o| o >= i) {
            bail!(Value, "kernel {}: v{i} reads a later value", k.name);
        }
        match &v.expr {
            Expr::Load { buffer, map } => {
                check_map(buffers, k, *buffer, map)?;
                if buffer_in(buffers, *buffer)?.dtype != v.dtype {
                    bail!(Value, "kernel {}: v{i} loads with the wrong dtype", k.name);
                }
            }
            Expr::Index { map } if map.strides.len() != k.outer.len() + k.inner.len() => {
                bail!(Value, "kernel {}: v{i} has a malformed index", k.name);
            }
            _ => {}
        }
    }
    let pass_of = pass_of(k)?;
    for (p, vs) in k.passes.iter().enumerate() {
        for &r in vs {
            let mut stack = k.values[r].expr.operands();
            while let Some(o) = stack.pop() {
                if let Some(&q) = pass_of.get(&o)
                    && q >= p
                {
                    bail!(
                        Value,
                        "kernel {}: pass {p} reads a reduction of pass {q}",
                        k.name
                    );
                }
                stack.extend(k.values[o].expr.operands());
            }
        }
    }
    let levels = k.levels();
    for s in &k.stores {
        if s.value >= n {
            bail!(Value, "kernel {}: a store reads a missing value", k.name);
        }
        check_map(buffers, k, s.buffer, &s.map)?;
        if buffer_in(buffers, s.buffer)?.dtype != k.values[s.value].dtype {
            bail!(Value, "kernel {}: a store has the wrong dtype", k.name);
        }
        let row_store = !k.inner.is_empty() && s.map.ignores_from(k.outer.len());
        if row_store && levels[s.value] == Level::Inner {
            bail!(
                Value,
                "kernel {}: a row store of a value that varies along the row",
                k.name
            );
        }
    }
    Ok(())
}

/// Checks that every value follows its op's dtype rule (the typing contract of [`Expr`]):
/// operands of a binary op share a dtype, unary results have `UnaryOp::out_dtype`, masks and
/// conditions are bool, and no op a PyTorch kernel refuses (integer `div`, which computes in
/// floats; `sub` or `remainder` of bools) appears. Also runs the eager argument checks of
/// `clamp` and `masked_fill`, so a bound that does not fit the dtype is an error before
/// anything runs. `backend` starts the messages.
pub fn check_ops(k: &Kernel, backend: &str) -> Result<()> {
    for (i, v) in k.values.iter().enumerate() {
        match &v.expr {
            Expr::Clamp { min, max, .. } => {
                let probe = Tensor::alloc(v.dtype, &[])?;
                apply(
                    Op::Clamp {
                        min: *min,
                        max: *max,
                    },
                    &[&probe],
                )?;
            }
            Expr::MaskedFill { value, mask, .. } => {
                if k.values[*mask].dtype != DType::Bool {
                    bail!(Unsupported, "{backend}: v{i}: mask is not bool");
                }
                let probe = Tensor::alloc(v.dtype, &[])?;
                let mask = Tensor::alloc(DType::Bool, &[])?;
                apply(Op::MaskedFill { value: *value }, &[&probe, &mask])?;
            }
            Expr::Unary(u, a) => {
                let da = k.values[*a].dtype;
                let want = u.out_dtype(da)?;
                if want != v.dtype {
                    bail!(
                        Unsupported,
                        "{backend}: v{i} = {}({da}) declared {}",
                        u.name(),
                        v.dtype
                    );
                }
            }
            Expr::Binary(op, a, b) => {
                let (da, db) = (k.values[*a].dtype, k.values[*b].dtype);
                if da != db {
                    bail!(
                        Unsupported,
                        "{backend}: v{i} = {} of {da} and {db}: operands must share a dtype",
                        op.name()
                    );
                }
                if *op == BinaryOp::Div && !da.is_float() {
                    bail!(
                        Unsupported,
                        "{backend}: integer div (v{i}) is not lowered: div computes in floats"
                    );
                }
                let no_bools = [
                    BinaryOp::Sub,
                    BinaryOp::Remainder,
                    BinaryOp::DivFloor,
                    BinaryOp::DivTrunc,
                ];
                if no_bools.contains(op) && da == DType::Bool {
                    bail!(Unsupported, "{backend}: {} of bools (v{i})", op.name());
                }
            }
            Expr::Where(c, _, _) if k.values[*c].dtype != DType::Bool => {
                bail!(Unsupported, "{backend}: v{i}: condition is not bool");
            }
            _ => {}
        }
    }
    Ok(())
}
