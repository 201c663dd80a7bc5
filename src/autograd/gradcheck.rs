//! `gradcheck`: the analytic Jacobian (one backward per output element) against central
//! finite differences computed in f64.

use super::no_grad;
use crate::runtime::Tensor;
use crate::{DType, Error, Result, bail};

/// Step and tolerances of [`gradcheck_with`]; PyTorch's defaults.
#[derive(Clone, Copy, Debug)]
pub struct GradcheckOptions {
    /// Finite-difference step (PyTorch: `1e-6`).
    pub eps: f64,
    /// Absolute tolerance (PyTorch: `1e-5`).
    pub atol: f64,
    /// Relative tolerance (PyTorch: `1e-3`).
    pub rtol: f64,
}

impl Default for GradcheckOptions {
    fn default() -> GradcheckOptions {
        GradcheckOptions {
            eps: 1e-6,
            atol: 1e-5,
            rtol: 1e-3,
        }
    }
}

/// Checks the gradients of `f` at `inputs` with PyTorch's default step and tolerances.
/// Floating-point inputs that require grad are checked (all of them if none does).
pub fn gradcheck(f: impl Fn(&[Tensor]) -> Result<Tensor>, inputs: &[Tensor]) -> Result<()> {
    gradcheck_with(f, inputs, GradcheckOptions::default())
}

/// A copy of `t` in its own storage, with the same dtype and shape.
fn fresh(t: &Tensor, values: &[f64]) -> Result<Tensor> {
    let _off = no_grad();
    Tensor::from_vec(values.to_vec(), t.shape())?.to_dtype(t.dtype())
}

/// `gradcheck` with explicit options.
pub fn gradcheck_with(
    f: impl Fn(&[Tensor]) -> Result<Tensor>,
    inputs: &[Tensor],
    opts: GradcheckOptions,
) -> Result<()> {
    check(&f, inputs, opts)
}

/// The check itself, compiled once rather than once per closure type.
fn check(
    f: &dyn Fn(&[Tensor]) -> Result<Tensor>,
    inputs: &[Tensor],
    opts: GradcheckOptions,
) -> Result<()> {
    let any_marked = inputs.iter().any(|t| t.requires_grad());
    let checked: Vec<bool> = inputs
        .iter()
        .map(|t| t.dtype().is_float() && (!any_marked || t.requires_grad()))
        .collect();
    if !checked.iter().any(|&c| c) {
        bail!(
            Value,
            "gradcheck expects at least one input tensor to require gradient"
        );
    }
    let base: Vec<Vec<f64>> = inputs.iter().map(|t| t.to_f64_vec()).collect();
    // Analytic: one backward per output element, on fresh leaves.
    let leaves: Vec<Tensor> = inputs
        .iter()
        .zip(&base)
        .zip(&checked)
        .map(|((t, b), &c)| {
            let l = fresh(t, b)?;
            if c {
                l.requires_grad_(true)?;
            }
            Ok(l)
        })
        .collect::<Result<_>>()?;
    let out = f(&leaves)?;
    if !out.dtype().is_float() {
        bail!(
            Value,
            "gradcheck: the function's result must be floating point"
        );
    }
    let n_out = out.numel();
    let mut analytic: Vec<Vec<Vec<f64>>> = inputs
        .iter()
        .map(|t| vec![vec![0.0; n_out]; t.numel()])
        .collect();
    for j in 0..n_out {
        if !out.requires_grad() {
            break;
        }
        let mut seed = vec![0.0; n_out];
        seed[j] = 1.0;
        let seed = Tensor::from_vec(seed, out.shape())?.to_dtype(out.dtype())?;
        for l in &leaves {
            l.set_grad(None);
        }
        out.backward_opts(Some(&seed), true)?;
        for (i, l) in leaves.iter().enumerate() {
            if let Some(g) = l.grad() {
                for (k, v) in g.to_f64_vec().into_iter().enumerate() {
                    analytic[i][k][j] = v;
                }
            }
        }
    }
    // Numerical: central differences, one input element at a time.
    for (i, t) in inputs.iter().enumerate() {
        if !checked[i] {
            continue;
        }
        for k in 0..t.numel() {
            let eval = |delta: f64| -> Result<Vec<f64>> {
                let _off = no_grad();
                let mut args: Vec<Tensor> = Vec::with_capacity(inputs.len());
                for (m, (u, b)) in inputs.iter().zip(&base).enumerate() {
                    let mut v = b.clone();
                    if m == i {
                        v[k] += delta;
                    }
                    args.push(fresh(u, &v)?);
                }
                Ok(f(&args)?.to_dtype(DType::F64)?.to_f64_vec())
            };
            let plus = eval(opts.eps)?;
            let minus = eval(-opts.eps)?;
            for j in 0..n_out {
                let num = (plus[j] - minus[j]) / (2.0 * opts.eps);
                let ana = analytic[i][k][j];
                let ok = (num - ana).abs() <= opts.atol + opts.rtol * num.abs()
                    || (num.is_nan() && ana.is_nan());
                if !ok {
                    return Err(Error::Value(format!(
                        "Jacobian mismatch for output {j} with respect to input {i}, element {k}: numerical {num} but analytical {ana}{}",
                        precision_hint(inputs, &checked)
                    )));
                }
            }
        }
    }
    Ok(())
}

/// PyTorch's warning, added to a mismatch when a checked input is not f64: finite
/// differences with the default step are meaningless in single or half precision.
fn precision_hint(inputs: &[Tensor], checked: &[bool]) -> String {
    match inputs
        .iter()
        .zip(checked)
        .position(|(t, &c)| c && t.dtype() != DType::F64)
    {
        Some(i) => format!(
            ". Input #{i} requires gradient and is not a double precision floating point ({}): this check will likely fail unless every input is f64",
            inputs[i].dtype()
        ),
        None => String::new(),
    }
}
