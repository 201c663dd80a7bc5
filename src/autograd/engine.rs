//! `backward`: turns the recorded nodes a result depends on into an IR graph, appends the
//! reverse sweep with `passes::autodiff`, and evaluates only the gradient nodes, feeding the
//! forward values that were kept when the ops ran. Custom functions cut the graph: their
//! outputs become graph inputs, and their own backward seeds a further sweep below them.

use super::backward_plan::Walk;
use super::tape::{Edge, GradNode, NodeOp};
use crate::ir::dtype::DType;
use crate::runtime::kernels::copy;
use crate::runtime::{Device, MemoryFormat, Tensor};
use crate::{Error, Result, bail};
use std::collections::{HashMap, HashSet};
use std::sync::Arc;

type Key = *const GradNode;

fn key(n: &Arc<GradNode>) -> Key {
    Arc::as_ptr(n)
}

pub(crate) const SECOND_BACKWARD: &str = "Trying to backward through the graph a second time (or directly access saved tensors after they have already been freed). Saved intermediate values of the graph are freed when you call .backward() or autograd.grad(). Specify retain_graph=True if you need to backward through the graph a second time or if you need to access saved tensors after calling backward.";

/// PyTorch's legacy tensor type name (`torch.FloatTensor`).
pub(crate) fn legacy_type(dtype: DType) -> &'static str {
    match dtype {
        DType::F32 => "torch.FloatTensor",
        DType::F64 => "torch.DoubleTensor",
        DType::F16 => "torch.HalfTensor",
        DType::BF16 => "torch.BFloat16Tensor",
        DType::I64 => "torch.LongTensor",
        DType::I32 => "torch.IntTensor",
        DType::I16 => "torch.ShortTensor",
        DType::I8 => "torch.CharTensor",
        DType::U8 => "torch.ByteTensor",
        DType::Bool => "torch.BoolTensor",
    }
}

/// The error for a saved value whose storage was written after it was saved.
pub(crate) fn modified_error(t: &Tensor, producer: Option<String>, expected: u64) -> Error {
    let what = match producer {
        Some(p) => format!(", which is output 0 of {p},"),
        None => String::new(),
    };
    Error::Value(format!(
        "one of the variables needed for gradient computation has been modified by an inplace operation: [{} {:?}]{what} is at version {}; expected version {expected} instead. Hint: the backtrace further above shows the operation that failed to compute its gradient. The variable in question was changed in there or anywhere later. Good luck!",
        legacy_type(t.dtype()),
        t.shape(),
        t.version()
    ))
}

/// Adds `g` to the `.grad` of `t`.
pub(crate) fn accumulate_grad(t: &Tensor, g: Tensor) -> Result<()> {
    let _off = super::no_grad();
    let new = match t.grad() {
        Some(old) => old.add(&g)?,
        None => {
            // A gradient that is a view of some other tensor gets its own storage, laid out
            // as the leaf is (PyTorch's layout contract: channels_last stays channels_last).
            let own = g.storage_offset() == 0 && g.numel() == g.storage().len();
            let nhwc = t.suggest_memory_format() == MemoryFormat::ChannelsLast;
            if nhwc && g.device() == Device::Cpu {
                if own && g.strides() == t.strides() {
                    g
                } else {
                    copy::to_channels_last(&g)?
                }
            } else if own && g.is_contiguous() {
                g
            } else {
                g.contiguous()?
            }
        }
    };
    t.set_grad(Some(new));
    // cloned so that a hook may touch this tensor's state; most leaves have none
    let hooks = {
        let m = t.meta();
        if m.post_accumulate.is_empty() {
            return Ok(());
        }
        m.post_accumulate.clone()
    };
    for h in hooks {
        h(t)?;
    }
    Ok(())
}

/// Runs the reverse sweep from `root` seeded with `seed`.
pub(crate) fn backward(root: &Tensor, seed: Tensor, retain_graph: bool) -> Result<()> {
    let node = {
        let m = root.meta();
        if !m.requires_grad {
            bail!(
                Value,
                "element 0 of tensors does not require grad and does not have a grad_fn"
            );
        }
        m.node()
    };
    let Some(node) = node else {
        return accumulate_grad(root, seed);
    };
    if node.is_freed() {
        bail!(Value, "{SECOND_BACKWARD}");
    }
    // Post-order positions of the custom functions: they run from the highest down. Only
    // needed once a custom function is reached, so computed then.
    let root = node.clone();
    let mut order: Option<HashMap<Key, usize>> = None;
    let mut pending: HashMap<Key, (Arc<GradNode>, Tensor)> = HashMap::new();
    let mut seeds: Vec<(Arc<GradNode>, Tensor)> = vec![(node, seed)];
    let mut visited: Vec<Arc<GradNode>> = Vec::new();
    loop {
        let (custom, ir): (Vec<_>, Vec<_>) = seeds
            .drain(..)
            .partition(|(n, _)| matches!(n.op, NodeOp::Custom(_)));
        for (n, g) in custom {
            add_pending(&mut pending, n, g)?;
        }
        if !ir.is_empty() {
            sweep(&ir, &mut pending, &mut visited)?;
        }
        if pending.is_empty() {
            break;
        }
        let order = order.get_or_insert_with(|| custom_order(&root));
        let Some(next) = pending
            .keys()
            .copied()
            .max_by_key(|k| order.get(k).copied().unwrap_or(0))
        else {
            break;
        };
        let Some((n, g)) = pending.remove(&next) else {
            break;
        };
        if let Some(t) = n.retained_tensor() {
            accumulate_grad(&t, g.clone())?;
        }
        let NodeOp::Custom(f) = &n.op else { continue };
        if n.is_freed() {
            bail!(Value, "{SECOND_BACKWARD}");
        }
        let grads = {
            let _off = super::no_grad();
            f.backward(&g)?
        };
        if grads.len() != n.inputs.len() {
            bail!(
                Value,
                "function {} returned an incorrect number of gradients (expected {}, got {})",
                n.name(),
                n.inputs.len(),
                grads.len()
            );
        }
        for (i, (e, gi)) in n.inputs.iter().zip(grads).enumerate() {
            let Some(gi) = gi else { continue };
            let expect = match e {
                Edge::Node(c) => c.out_type.clone(),
                Edge::Leaf(t) | Edge::Const(t) => t.ttype(),
            };
            if gi.shape() != expect.shape.as_slice() {
                bail!(
                    Value,
                    "Function {} returned an invalid gradient at index {i} - got {:?} but expected shape compatible with {:?}",
                    n.name(),
                    gi.shape(),
                    expect.shape
                );
            }
            let gi = if gi.dtype() != expect.dtype && expect.dtype.is_float() {
                let _off = super::no_grad();
                gi.to_dtype(expect.dtype)?
            } else {
                gi
            };
            match e {
                Edge::Node(c) => seeds.push((c.clone(), gi)),
                Edge::Leaf(t) => accumulate_grad(t, gi)?,
                Edge::Const(_) => {}
            }
        }
        visited.push(n);
    }
    if !retain_graph {
        for n in visited {
            n.free();
        }
    }
    Ok(())
}

fn add_pending(
    pending: &mut HashMap<Key, (Arc<GradNode>, Tensor)>,
    n: Arc<GradNode>,
    g: Tensor,
) -> Result<()> {
    match pending.remove(&key(&n)) {
        Some((n, old)) => {
            let _off = super::no_grad();
            let sum = old.add(&g)?;
            pending.insert(key(&n), (n, sum));
        }
        None => {
            pending.insert(key(&n), (n, g));
        }
    }
    Ok(())
}

/// One IR sweep from the seeded nodes down to leaves and custom-function outputs.
fn sweep(
    seeds: &[(Arc<GradNode>, Tensor)],
    pending: &mut HashMap<Key, (Arc<GradNode>, Tensor)>,
    visited: &mut Vec<Arc<GradNode>>,
) -> Result<()> {
    let mut w = Walk::default();
    for (n, g) in seeds {
        w.seed(n, g)?;
    }
    // Leaves with hooks (DistributedDataParallel's) get their gradient the moment it is
    // computed, so what the hooks start overlaps the rest of the sweep.
    let hooked = w
        .leaf_list
        .iter()
        .any(|(_, t)| !t.meta().post_accumulate.is_empty());
    let n_leaves = w.leaf_list.len();
    let mut early = vec![false; n_leaves];
    let grads = if hooked {
        w.gradients_as_ready(&mut |i, g| {
            if let Some((_, t)) = w.leaf_list.get(i) {
                accumulate_grad(t, g.clone())?;
                early[i] = true;
            }
            Ok(())
        })?
    } else {
        w.gradients()?
    };
    let mut it = grads.into_iter();
    for (i, (_, t)) in w.leaf_list.iter().enumerate() {
        if let Some(Some(g)) = it.next()
            && !early[i]
        {
            accumulate_grad(t, g)?;
        }
    }
    for (_, n) in &w.cuts {
        if let Some(Some(g)) = it.next() {
            add_pending(pending, n.clone(), g)?;
        }
    }
    for (_, n) in &w.retained {
        if let Some(Some(g)) = it.next()
            && let Some(t) = n.retained_tensor()
        {
            accumulate_grad(&t, g)?;
        }
    }
    visited.append(&mut w.visited);
    Ok(())
}

/// Post-order positions of the custom-function nodes reachable from `root`.
fn custom_order(root: &Arc<GradNode>) -> HashMap<Key, usize> {
    let mut pos: HashMap<Key, usize> = HashMap::new();
    let mut seen: HashSet<Key> = HashSet::new();
    let mut any_custom = false;
    let mut stack = vec![(root.clone(), false)];
    let mut next = 0usize;
    while let Some((n, expanded)) = stack.pop() {
        if expanded {
            if matches!(n.op, NodeOp::Custom(_)) {
                any_custom = true;
                pos.insert(key(&n), next);
            }
            next += 1;
            continue;
        }
        if !seen.insert(key(&n)) {
            continue;
        }
        stack.push((n.clone(), true));
        for e in &n.inputs {
            if let Edge::Node(c) = e
                && !seen.contains(&key(c))
            {
                stack.push((c.clone(), false));
            }
        }
    }
    if !any_custom {
        pos.clear();
    }
    pos
}
