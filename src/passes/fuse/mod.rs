//! The fusion partitioner: graph → [`Schedule`] of fused kernels and extern calls.
//!
//! Run [`super::decompose::decompose`] first (or call [`compile`]) so composites are visible.
//!
//! ## Model
//! Every graph value is one of: a buffer (input, captured constant, extern result), a view
//! (folded into the index maps of its readers), an inline leaf (`full`, `arange`, Python
//! scalars: constants and positions), a pointwise op, or a reduction. Pointwise ops are
//! recomputed inside every kernel that reads them unless they are *realised* (stored to a
//! buffer). Realised values and reductions are the *roots*; roots are grouped into kernels:
//! - a **pointwise kernel** stores roots of one shape (its index space);
//! - a **row kernel** holds reductions of one row space (input shape `S`, reduced dims `R`;
//!   space = kept dims ++ reduced dims) in dependency-ordered passes, its pointwise prologue
//!   (inlined into the reductions), and its epilogue: roots of shape `S` (which may read the
//!   reductions broadcast back along the row: softmax, layer_norm) and roots of the reduced
//!   shape (row stores);
//! - `matmul` and ops without a kernel lowering are **extern calls** on strided views of
//!   their operands (a transposed weight is a view, not a copy). Their epilogue (bias,
//!   activation, scale, residual) is an ordinary pointwise kernel that follows them.
//!
//! ## Rules (and whose they are)
//! - Graph outputs and extern operands are materialised (tinygrad, Inductor); an output that
//!   is a view of a buffer is returned as that view, without a copy.
//! - At most one reduction row space per kernel (tinygrad). A consumer of a reduction joins its
//!   kernel only when it reads the reduced value at the row it is computing, i.e. through the
//!   keepdim broadcast along the row (tinygrad's "same size" rule, widened to the broadcast
//!   that softmax needs); a read at another row stores the reduction and reloads it.
//! - A producer that costs [`FuseOptions::expensive`] or more is not recomputed for every
//!   element of a broadcast (XLA: no expensive producer into a consumer that reuses its
//!   elements), nor in several kernels (XLA's duplication limit): it is realised instead.
//!   Values that depend only on the row are computed once per row, so they do not count as
//!   duplicated inside a row kernel.
//! - A root does not join a kernel whose first root is more than
//!   [`FuseOptions::max_distance`] nodes earlier in topological order (Inductor's proximity
//!   rule, which protects peak memory), and a recomputed expression cone is cut at
//!   [`FuseOptions::max_cone`] (XLA's code-size limit).
//! - Extern kernels never fuse inward (Inductor); grouping never creates a cycle between
//!   steps.
//! - Horizontal fusion: roots of the same index space that share an input share a kernel.
//!
//! Decisions that turn out impossible while building a kernel (a reshape that no affine map
//! can express, a reduction read at another row) are resolved by realising the value or
//! isolating the root, and planning again; every round adds one such decision, so planning
//! ends.

mod affine;
mod build;
mod partition;

pub(crate) use partition::nhwc_values;

use super::decompose::decompose;
use crate::ir::graph::{Graph, ValueId};
use crate::kernel::Schedule;
use crate::{Error, Result};
use partition::Fuser;

/// Limits of the partitioner.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct FuseOptions {
    /// Cost from which a producer is realised rather than recomputed per broadcast element
    /// or in several kernels (an `exp` costs 4, an `add` 1).
    pub expensive: u32,
    /// Largest cost of an expression recomputed inside one kernel.
    pub max_cone: u32,
    /// Largest distance in topological order between the first and the last root of a kernel.
    pub max_distance: usize,
    /// False for the unfused baseline: every pointwise op and reduction is its own kernel
    /// (views are still folded into index maps, matmul is still an extern call).
    pub fuse: bool,
    /// Graph inputs stored in the channels_last memory format (NHWC): the 4-D values
    /// computed from them are stored NHWC too (see `Fuser::channels_last`).
    pub channels_last_inputs: Vec<String>,
}

impl Default for FuseOptions {
    fn default() -> FuseOptions {
        FuseOptions {
            expensive: 8,
            max_cone: 256,
            max_distance: 64,
            fuse: true,
            channels_last_inputs: Vec::new(),
        }
    }
}

/// Decomposes composites, then fuses: the usual way from a graph to a schedule.
pub fn compile(g: &Graph) -> Result<Schedule> {
    fuse(&decompose(g)?)
}

/// Partitions `g` into a schedule with the default limits.
pub fn fuse(g: &Graph) -> Result<Schedule> {
    fuse_with(g, &FuseOptions::default())
}

/// Fails where eager execution of `g` would fail a `view` for its operand's layout.
pub fn check_views(g: &Graph) -> Result<()> {
    Fuser::new(g, FuseOptions::default()).check_views()
}

/// Partitions `g` into a schedule.
pub fn fuse_with(g: &Graph, opts: &FuseOptions) -> Result<Schedule> {
    g.verify()?;
    let mut f = Fuser::new(g, opts.clone());
    f.check_views()?;
    f.realize_boundaries()?;
    if !opts.fuse {
        f.separate_all();
    }
    for _ in 0..4 * g.len() + 16 {
        f.cut_large_cones();
        let plan = f.plan();
        match f.build(&plan) {
            Ok(s) => return Ok(s),
            Err(Fail::Error(e)) => return Err(e),
            Err(Fail::Realize { node, root }) => {
                if !f.realized.insert(node) && !f.isolated.insert(root) {
                    return Err(stuck(g, root));
                }
            }
            Err(Fail::Isolate(root)) => {
                if !f.isolated.insert(root) {
                    return Err(stuck(g, root));
                }
            }
            Err(Fail::RealizeAlone(v)) => {
                // both already: nothing new to try
                if !f.realized.insert(v) & !f.isolated.insert(v) {
                    return Err(stuck(g, v));
                }
            }
        }
    }
    Err(Error::Unsupported(format!(
        "fusion of graph {} did not settle",
        g.name
    )))
}

fn stuck(g: &Graph, v: ValueId) -> Error {
    Error::Unsupported(format!("fusion: no kernel can compute %{}", g.node(v).name))
}

/// Why a kernel could not be built as planned.
enum Fail {
    /// Store `node` to a buffer (it is read where recomputing or mapping it is not possible).
    Realize {
        node: ValueId,
        root: ValueId,
    },
    /// `root` must get a kernel of its own.
    Isolate(ValueId),
    /// Store `node` from a kernel of its own.
    RealizeAlone(ValueId),
    Error(Error),
}

impl From<Error> for Fail {
    fn from(e: Error) -> Fail {
        Fail::Error(e)
    }
}

type R<T> = std::result::Result<T, Fail>;
