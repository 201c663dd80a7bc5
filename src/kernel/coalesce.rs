//! Coalescing of a kernel's index space: fewer, longer loops for a backend that walks the
//! space as a loop nest (the Cranelift one; the CUDA one walks flat indices and recovers only
//! the positions some map needs, so it does not coalesce).

use super::{Expr, IndexMap, Kernel};
use crate::ir::shape::numel;

/// Merges adjacent dims (separately inside `outer` and `inner`) that every map walks as one,
/// and drops size-1 dims. The result has the same flat row order and the same elements.
pub fn coalesce(k: &Kernel) -> Kernel {
    if numel(&k.space()) == 0 {
        return k.clone();
    }
    let ko = k.outer.len();
    let mut maps: Vec<&IndexMap> = Vec::new();
    for v in &k.values {
        if let Expr::Load { map, .. } | Expr::Index { map } = &v.expr {
            maps.push(map);
        }
    }
    maps.extend(k.stores.iter().map(|s| &s.map));
    // groups: (size, first dim, last dim); strides of a group are those of its last dim
    let group = |dims: std::ops::Range<usize>, sizes: &[usize]| {
        let mut gs: Vec<(usize, usize)> = Vec::new(); // (size, last dim)
        for d in dims {
            let n = sizes[d];
            if n == 1 {
                continue;
            }
            if let Some(last) = gs.last_mut()
                && maps.iter().all(|m| m.strides[last.1] == m.strides[d] * n)
            {
                last.0 *= n;
                last.1 = d;
                continue;
            }
            gs.push((n, d));
        }
        gs
    };
    let space = k.space();
    let og = group(0..ko, &space);
    let mut ig = group(ko..space.len(), &space);
    // a row kernel keeps one inner dim (of size 1 when all were, or when it reduces over a
    // 0-d space), so it stays a row kernel
    let pad = (!k.inner.is_empty() || k.reductions() > 0) && ig.is_empty();
    if pad {
        ig.push((1, usize::MAX));
    }
    let remap = |m: &IndexMap| IndexMap {
        strides: og
            .iter()
            .chain(&ig)
            .map(|&(_, d)| m.strides.get(d).copied().unwrap_or(0))
            .collect(),
        offset: m.offset,
    };
    let mut out = k.clone();
    out.outer = og.iter().map(|g| g.0).collect();
    out.inner = ig.iter().map(|g| g.0).collect();
    for v in &mut out.values {
        if let Expr::Load { map, .. } | Expr::Index { map } = &mut v.expr {
            *map = remap(map);
        }
    }
    for s in &mut out.stores {
        s.map = remap(&s.map);
    }
    out
}

/// A pointwise kernel (no inner dims, no reductions) with its outer dims reordered so that
/// the first store's strides decrease: the innermost loop then walks its output in memory
/// order (an NHWC store of an NCHW-ordered space would otherwise write with a stride of C
/// in the innermost loop). Each row is still one point of the space, so which rows a chunk
/// runs is unaffected; only the order inside the kernel changes. `None`: the order is
/// already right (or the kernel is not pointwise).
pub fn store_order(k: &Kernel) -> Option<Kernel> {
    let st = k.stores.first()?;
    let ko = k.outer.len();
    if !k.inner.is_empty() || !k.passes.is_empty() || st.map.strides.len() != ko {
        return None;
    }
    let s = &st.map.strides;
    if s.windows(2).all(|w| w[0] >= w[1]) {
        return None;
    }
    let mut perm: Vec<usize> = (0..ko).collect();
    // larger strides outside; size-1 dims anywhere (their stride is never stepped)
    perm.sort_by_key(|&d| std::cmp::Reverse(if k.outer[d] == 1 { usize::MAX } else { s[d] }));
    let mut out = k.clone();
    out.outer = perm.iter().map(|&d| k.outer[d]).collect();
    let permute = |m: &mut IndexMap| {
        m.strides = perm.iter().map(|&d| m.strides[d]).collect();
    };
    for v in &mut out.values {
        if let Expr::Load { map, .. } | Expr::Index { map } = &mut v.expr {
            permute(map);
        }
    }
    for st in &mut out.stores {
        permute(&mut st.map);
    }
    Some(out)
}
