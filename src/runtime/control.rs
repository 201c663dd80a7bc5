//! What the control ops compute (`ir::control`), written once for every executor: the
//! reference interpreter runs the bodies on itself, the compiled executors on their compiled
//! bodies, through [`Bodies`].

use crate::ir::control::{Control, ControlKind};
use crate::ir::op::Op;
use crate::ir::op::TensorType;
use crate::runtime::device::Device;
use crate::runtime::kernels::copy;
use crate::runtime::layout::Layout;
use crate::runtime::tensor::{Tensor, apply};
use crate::{Result, bail};

/// How an executor runs the bodies of one control op.
pub trait Bodies {
    /// Runs body `i` (in [`ControlKind::body_names`] order) on `inputs`. `into[k]`, when
    /// given, is a tensor of output `k`'s type that the loop no longer needs: the body may
    /// write that output into it rather than into new memory (and must check that it is
    /// safe to, as `CompiledFn::call_into` does).
    fn call(&self, i: usize, inputs: &[Tensor], into: &[Option<&Tensor>]) -> Result<Vec<Tensor>>;
}

/// Runs control op `c` on `args` (its operands); returns its results.
pub fn run(c: &Control, args: &[Tensor], bodies: &dyn Bodies) -> Result<Vec<Tensor>> {
    // A literal operand (`fori_loop(0, 3, 0.5, ..)`) arrives as a wrapped Python number; the
    // typing rule makes it a plain 0-d tensor for the bodies and results, and so must this,
    // or type promotion in a body (`mul(%f, 1.5)`) would differ from the body's types.
    let args: Vec<Tensor> = args
        .iter()
        .map(|a| match a.is_wrapped_number() {
            true => a.with_layout(a.layout().clone()),
            false => a.clone(),
        })
        .collect();
    let args = args.as_slice();
    let types: Vec<TensorType> = args.iter().map(Tensor::ttype).collect();
    let results = c.result_types(&types.iter().collect::<Vec<_>>())?;
    match c.kind {
        ControlKind::Cond => {
            let pred = truth(&args[0], "cond: the predicate")?;
            bodies.call(if pred { 0 } else { 1 }, &args[1..], &[])
        }
        ControlKind::WhileLoop => {
            let mut carries = Carries::new(args.to_vec());
            loop {
                let p = bodies.call(0, &carries.now, &[])?;
                if !truth(&p[0], "while_loop: the condition")? {
                    return Ok(carries.now);
                }
                let inputs = carries.now.clone();
                let out = bodies.call(1, &inputs, &carries.spare_refs())?;
                carries.advance(out);
            }
        }
        ControlKind::ForiLoop => {
            let (lower, upper) = (int(&args[0])?, int(&args[1])?);
            let mut carries = Carries::new(args[2..].to_vec());
            for i in lower..upper {
                let mut inputs = Vec::with_capacity(carries.now.len() + 1);
                inputs.push(Tensor::scalar(i));
                inputs.extend(carries.now.iter().cloned());
                let out = bodies.call(0, &inputs, &carries.spare_refs())?;
                carries.advance(out);
            }
            Ok(carries.now)
        }
        ControlKind::Scan {
            carries: n,
            reverse,
        } => {
            let (cs, xs) = args.split_at(n);
            let len = xs[0].shape()[0];
            let mut ys = Stacked::new(&results[n..], xs[0].device())?;
            let mut carries = Carries::new(cs.to_vec());
            for step in 0..len {
                let t = if reverse { len - 1 - step } else { step };
                let mut inputs = carries.now.clone();
                inputs.extend(xs.iter().map(|x| slice(x, t)));
                let mut spare: Vec<Option<&Tensor>> = carries.spare_refs();
                spare.resize(results.len(), None);
                let mut out = bodies.call(0, &inputs, &spare)?;
                ys.put(t, out.split_off(n));
                carries.advance(out);
            }
            let mut res = carries.now;
            res.extend(ys.finish()?);
            Ok(res)
        }
    }
}

/// The carries of a loop, and the previous iteration's (which the body produced, so the
/// loop alone holds them): the next iteration may write its results into those.
struct Carries {
    now: Vec<Tensor>,
    spare: Vec<Option<Tensor>>,
    /// Whether `now` came from the body (the first carries are the caller's operands).
    owned: bool,
}

impl Carries {
    fn new(now: Vec<Tensor>) -> Carries {
        // the operands belong to the caller: never written into
        let spare = vec![None; now.len()];
        Carries {
            now,
            spare,
            owned: false,
        }
    }

    fn spare_refs(&self) -> Vec<Option<&Tensor>> {
        self.spare.iter().map(Option::as_ref).collect()
    }

    fn advance(&mut self, out: Vec<Tensor>) {
        let old = std::mem::replace(&mut self.now, out);
        let owned = std::mem::replace(&mut self.owned, true);
        self.spare = old
            .into_iter()
            .zip(&self.now)
            .map(|(o, n)| (owned && !o.shares_storage(n)).then_some(o))
            .collect();
    }
}

/// A scan's per-step outputs, stacked along a new dim 0: on the CPU written into the
/// result as they come; on a GPU kept and stacked by the device's eager `stack` at the end.
enum Stacked {
    Host(Vec<Tensor>),
    Device {
        types: Vec<TensorType>,
        device: Device,
        steps: Vec<(usize, Vec<Tensor>)>,
    },
}

impl Stacked {
    fn new(types: &[TensorType], device: Device) -> Result<Stacked> {
        Ok(match device {
            Device::Cpu => Stacked::Host(
                types
                    .iter()
                    .map(|t| Tensor::alloc_for_overwrite(t.dtype, &t.shape))
                    .collect::<Result<_>>()?,
            ),
            _ => Stacked::Device {
                types: types.to_vec(),
                device,
                steps: Vec::new(),
            },
        })
    }

    fn put(&mut self, t: usize, ys: Vec<Tensor>) {
        match self {
            Stacked::Host(all) => {
                for (y, yt) in all.iter().zip(&ys) {
                    copy::copy_into(&slice(y, t), yt);
                }
            }
            Stacked::Device { steps, .. } => steps.push((t, ys)),
        }
    }

    fn finish(self) -> Result<Vec<Tensor>> {
        let (types, device, mut steps) = match self {
            Stacked::Host(all) => return Ok(all),
            Stacked::Device {
                types,
                device,
                steps,
            } => (types, device, steps),
        };
        steps.sort_by_key(|(t, _)| *t);
        types
            .iter()
            .enumerate()
            .map(|(k, ty)| {
                if steps.is_empty() {
                    let host = Tensor::zeros(&ty.shape, ty.dtype);
                    return match device {
                        Device::Cuda(i) => crate::runtime::cuda::tensor::upload(&host, i),
                        Device::Cpu => Ok(host),
                    };
                }
                let parts: Vec<&Tensor> = steps.iter().map(|(_, ys)| &ys[k]).collect();
                apply(Op::Stack { dim: 0 }, &parts)
            })
            .collect()
    }
}

/// Slice `t` of dim 0 of `x` (a view).
fn slice(x: &Tensor, t: usize) -> Tensor {
    let l = x.layout();
    x.with_layout(Layout {
        shape: l.shape[1..].to_vec(),
        strides: l.strides[1..].to_vec(),
        offset: l.offset + t * l.strides[0],
    })
}

fn truth(t: &Tensor, what: &str) -> Result<bool> {
    if t.numel() != 1 {
        bail!(Value, "{what} has {} elements, expected one", t.numel());
    }
    Ok(t.to_f64_vec()[0] != 0.0)
}

fn int(t: &Tensor) -> Result<i64> {
    match t.to_i64_vec().as_slice() {
        [i] => Ok(*i),
        _ => bail!(Value, "fori_loop: a bound has {} elements", t.numel()),
    }
}
