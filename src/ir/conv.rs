//! The convolution family's attributes and shape rules: `conv1d`/`conv2d`, the pooling ops,
//! `batch_norm` and `dropout`, with PyTorch's defaults, output sizes and error messages.
//!
//! Sizes are kept as given (`i64`) until an op is typed, so that a negative padding or a zero
//! stride is reported with PyTorch's message wherever it was written (eagerly or in text).

use super::dtype::DType;
use super::op::TensorType;
use super::unary::Real;
use crate::{Error, Result, bail};

/// The `padding` of a convolution: sizes per spatial dim, or PyTorch's two strings.
#[derive(Clone, Debug, PartialEq, Eq, Hash, serde::Serialize, serde::Deserialize)]
pub enum ConvPadding {
    /// Zeros added on both sides of each spatial dim.
    Explicit(Vec<i64>),
    /// `"same"`: the output has the input's size (stride 1); an odd total padding puts the
    /// extra element at the end, as PyTorch.
    Same,
    /// `"valid"`: no padding.
    Valid,
}

/// `stride`, `padding`, `dilation` and `groups` of a convolution with `stride.len()` spatial
/// dims (1 for `conv1d`, 2 for `conv2d`).
#[derive(Clone, Debug, PartialEq, Eq, Hash, serde::Serialize, serde::Deserialize)]
pub struct ConvAttrs {
    /// Step between output positions, per spatial dim.
    pub stride: Vec<i64>,
    /// Zero padding.
    pub padding: ConvPadding,
    /// Spacing between kernel taps, per spatial dim.
    pub dilation: Vec<i64>,
    /// Channel groups: input and output channels split into `groups` independent
    /// convolutions (`groups == channels` is a depthwise convolution).
    pub groups: i64,
}

/// A convolution's geometry once its operands' shapes are known: every size checked and
/// the padding resolved to a start and an end per spatial dim.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct ConvGeometry {
    /// Step between output positions.
    pub stride: Vec<usize>,
    /// Zeros before each spatial dim.
    pub pad_lo: Vec<usize>,
    /// Zeros after each spatial dim.
    pub pad_hi: Vec<usize>,
    /// Spacing between kernel taps.
    pub dilation: Vec<usize>,
    /// Channel groups.
    pub groups: usize,
}

/// Broadcasts an int-or-list attribute to `n` spatial dims (PyTorch's `_pair`), with
/// PyTorch's message for a list of another length.
pub fn spatial_list(what: &str, xs: &[i64], n: usize) -> Result<Vec<i64>> {
    match xs.len() {
        1 => Ok(vec![xs[0]; n]),
        l if l == n => Ok(xs.to_vec()),
        _ => bail!(
            Value,
            "expected {what} to be a single integer value or a list of {n} values to match the convolution dimensions, but got {what}={xs:?}"
        ),
    }
}

impl ConvAttrs {
    /// PyTorch's defaults for `spatial` dims: stride 1, padding 0, dilation 1, one group.
    pub fn new(spatial: usize) -> ConvAttrs {
        ConvAttrs {
            stride: vec![1; spatial],
            padding: ConvPadding::Explicit(vec![0; spatial]),
            dilation: vec![1; spatial],
            groups: 1,
        }
    }

    /// Number of spatial dims.
    pub fn spatial(&self) -> usize {
        self.stride.len()
    }

    /// The op name: `conv1d` or `conv2d`.
    pub fn op_name(&self) -> &'static str {
        if self.spatial() == 1 {
            "conv1d"
        } else {
            "conv2d"
        }
    }

    /// Checks the sizes and resolves the padding for a kernel of spatial sizes `kernel`.
    pub fn geometry(&self, kernel: &[usize]) -> Result<ConvGeometry> {
        let n = self.spatial();
        let explicit = match &self.padding {
            ConvPadding::Explicit(p) => p.len(),
            _ => n,
        };
        if !(1..=2).contains(&n) || self.dilation.len() != n || explicit != n || kernel.len() != n {
            bail!(
                Value,
                "a convolution over {} spatial dims needs stride, padding and dilation of one size per dim, got stride={:?}, padding={:?}, dilation={:?}",
                kernel.len(),
                self.stride,
                self.padding,
                self.dilation
            );
        }
        if self.stride.iter().any(|&s| s <= 0) {
            bail!(Value, "non-positive stride is not supported");
        }
        if self.dilation.iter().any(|&d| d <= 0) {
            bail!(Value, "non-positive dilation is not supported");
        }
        if self.groups <= 0 {
            bail!(Value, "non-positive groups is not supported");
        }
        let stride: Vec<usize> = self.stride.iter().map(|&s| s as usize).collect();
        let dilation: Vec<usize> = self.dilation.iter().map(|&d| d as usize).collect();
        let (pad_lo, pad_hi) = match &self.padding {
            ConvPadding::Explicit(p) => {
                if p.iter().any(|&p| p < 0) {
                    bail!(Value, "negative padding is not supported");
                }
                let p: Vec<usize> = p.iter().map(|&p| p as usize).collect();
                (p.clone(), p)
            }
            ConvPadding::Valid => (vec![0; n], vec![0; n]),
            ConvPadding::Same => {
                if stride.iter().any(|&s| s != 1) {
                    bail!(
                        Value,
                        "padding='same' is not supported for strided convolutions"
                    );
                }
                let total: Vec<usize> = (0..n).map(|i| dilation[i] * (kernel[i] - 1)).collect();
                let lo: Vec<usize> = total.iter().map(|t| t / 2).collect();
                let hi = total.iter().zip(&lo).map(|(t, l)| t - l).collect();
                (lo, hi)
            }
        };
        Ok(ConvGeometry {
            stride,
            pad_lo,
            pad_hi,
            dilation,
            groups: self.groups as usize,
        })
    }
}

fn dims_text(xs: &[usize], sep: &str) -> String {
    xs.iter()
        .map(|x| x.to_string())
        .collect::<Vec<_>>()
        .join(sep)
}

fn same_dtype(a: DType, b: DType) -> Result<()> {
    if a != b {
        bail!(
            DType,
            "expected scalar type {} but found {}",
            a.scalar_name(),
            b.scalar_name()
        );
    }
    Ok(())
}

impl ConvGeometry {
    /// The output size of each spatial dim for input sizes `input` and kernel sizes
    /// `kernel`, with PyTorch's message when the kernel does not fit the padded input.
    pub fn output_size(&self, input: &[usize], kernel: &[usize]) -> Result<Vec<usize>> {
        let n = input.len();
        if let Some(i) = (0..n).find(|&i| kernel[i] == 0) {
            bail!(Shape, "kernel size 0 in spatial dim {i}: {kernel:?}");
        }
        let too_large = || Error::Shape(format!("a window of {kernel:?} over {input:?} overflows"));
        let padded: Vec<usize> = (0..n)
            .map(|i| {
                input[i]
                    .checked_add(self.pad_lo[i])
                    .and_then(|x| x.checked_add(self.pad_hi[i]))
                    .ok_or_else(too_large)
            })
            .collect::<Result<_>>()?;
        let span: Vec<usize> = (0..n)
            .map(|i| {
                self.dilation[i]
                    .checked_mul(kernel[i] - 1)
                    .and_then(|x| x.checked_add(1))
                    .ok_or_else(too_large)
            })
            .collect::<Result<_>>()?;
        if (0..n).any(|i| padded[i] < span[i]) {
            bail!(
                Shape,
                "Calculated padded input size per channel: ({}). Kernel size: ({}). Kernel size can't be greater than actual input size",
                dims_text(&padded, " x "),
                dims_text(&span, " x ")
            );
        }
        Ok((0..n)
            .map(|i| (padded[i] - span[i]) / self.stride[i] + 1)
            .collect())
    }
}

/// The result type of `conv1d`/`conv2d(x, weight, bias)`, with PyTorch's checks. An
/// unbatched input (no batch dim) gives an unbatched result.
pub fn conv_type(
    attrs: &ConvAttrs,
    x: &TensorType,
    w: &TensorType,
    bias: Option<&TensorType>,
) -> Result<TensorType> {
    let n = attrs.spatial();
    let name = attrs.op_name();
    if x.ndim() != n + 1 && x.ndim() != n + 2 {
        bail!(
            Shape,
            "Expected {}D (unbatched) or {}D (batched) input to {name}, but got input of size: {:?}",
            n + 1,
            n + 2,
            x.shape
        );
    }
    if !x.dtype.is_float() {
        bail!(
            DType,
            "\"{name}\" not implemented for '{}'",
            x.dtype.scalar_name()
        );
    }
    same_dtype(x.dtype, w.dtype)?;
    if w.ndim() != n + 2 {
        bail!(
            Shape,
            "Expected {}-dimensional weight for {name}, but got weight of size {:?}",
            n + 2,
            w.shape
        );
    }
    let batched = x.ndim() == n + 2;
    let xs: Vec<usize> = if batched {
        x.shape.to_vec()
    } else {
        [&[1], &x.shape[..]].concat()
    };
    let kernel = &w.shape[2..];
    let geo = attrs.geometry(kernel)?;
    let (cout, groups) = (w.shape[0], geo.groups);
    if cout < groups {
        bail!(
            Shape,
            "Given groups={groups}, expected weight to be at least {groups} at dimension 0, but got weight of size {:?} instead",
            w.shape
        );
    }
    if cout % groups != 0 {
        bail!(
            Shape,
            "Given groups={groups}, expected weight to be divisible by {groups} at dimension 0, but got weight of size [{:?}] instead",
            w.shape
        );
    }
    if xs[1] != w.shape[1] * groups {
        bail!(
            Shape,
            "Given groups={groups}, weight of size {:?}, expected input{:?} to have {} channels, but got {} channels instead",
            w.shape,
            x.shape,
            w.shape[1] * groups,
            xs[1]
        );
    }
    if let Some(b) = bias {
        same_dtype(x.dtype, b.dtype)?;
        if b.shape != [cout] {
            bail!(
                Shape,
                "Given weight of size {:?}, expected bias to be 1-dimensional with {cout} elements, but got bias of size {:?} instead",
                w.shape,
                b.shape
            );
        }
    }
    let out = geo.output_size(&xs[2..], kernel)?;
    let mut shape = if batched { vec![xs[0]] } else { vec![] };
    shape.push(cout);
    shape.extend(out);
    Ok(TensorType::new(x.dtype, shape))
}

/// `kernel_size`, `stride`, `padding`, `dilation` and `ceil_mode` of a 2-d pooling.
#[derive(Clone, Debug, PartialEq, Eq, Hash, serde::Serialize, serde::Deserialize)]
pub struct PoolAttrs {
    /// Window size.
    pub kernel_size: Vec<i64>,
    /// Step between windows (PyTorch's default: the window size).
    pub stride: Vec<i64>,
    /// Implicit padding on both sides (negative infinity for max, zeros for average).
    pub padding: Vec<i64>,
    /// Spacing between window taps (max pooling only).
    pub dilation: Vec<i64>,
    /// Round the output size up rather than down (a last window may start in the padding's
    /// end but never past it).
    pub ceil_mode: bool,
}

/// A pooling's checked geometry.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct PoolGeometry {
    /// Window size.
    pub kernel: [usize; 2],
    /// Step between windows.
    pub stride: [usize; 2],
    /// Padding on both sides.
    pub padding: [usize; 2],
    /// Spacing between taps.
    pub dilation: [usize; 2],
}

impl PoolAttrs {
    /// A `k`×`k` window with PyTorch's defaults (stride = window, no padding).
    pub fn new(kernel_size: &[i64]) -> PoolAttrs {
        PoolAttrs {
            kernel_size: kernel_size.to_vec(),
            stride: kernel_size.to_vec(),
            padding: vec![0, 0],
            dilation: vec![1, 1],
            ceil_mode: false,
        }
    }

    /// Checks the sizes (PyTorch's messages).
    pub fn geometry(&self) -> Result<PoolGeometry> {
        for (name, v) in [
            ("kernel_size", &self.kernel_size),
            ("stride", &self.stride),
            ("padding", &self.padding),
            ("dilation", &self.dilation),
        ] {
            if v.len() != 2 {
                bail!(
                    Value,
                    "2-d pooling needs {name} to be a single integer value or a list of 2 values, but got {name}={v:?}"
                );
            }
        }
        let two = |v: &[i64]| [v[0], v[1]];
        let (k, s, p, d) = (
            two(&self.kernel_size),
            two(&self.stride),
            two(&self.padding),
            two(&self.dilation),
        );
        if k.iter().any(|&k| k <= 0) {
            bail!(
                Value,
                "kernel size should be greater than zero, but got kH: {} kW: {}",
                k[0],
                k[1]
            );
        }
        if s.iter().any(|&s| s <= 0) {
            bail!(Value, "stride should not be zero");
        }
        if d.iter().any(|&d| d <= 0) {
            bail!(
                Value,
                "dilation should be greater than zero, but got dilationH: {} dilationW: {}",
                d[0],
                d[1]
            );
        }
        if p.iter().any(|&p| p < 0) {
            bail!(
                Value,
                "pad must be non-negative, but got pad: {}",
                p[0].min(p[1])
            );
        }
        for i in 0..2 {
            if p[i] > ((k[i] - 1) * d[i] + 1) / 2 {
                bail!(
                    Value,
                    "pad should be at most half of effective kernel size, but got pad={}, kernel_size={} and dilation={}",
                    p[i],
                    k[i],
                    d[i]
                );
            }
        }
        let u = |v: [i64; 2]| [v[0] as usize, v[1] as usize];
        Ok(PoolGeometry {
            kernel: u(k),
            stride: u(s),
            padding: u(p),
            dilation: u(d),
        })
    }

    /// The output size of one dim (PyTorch's `pooling_output_shape`).
    fn output_len(&self, g: &PoolGeometry, i: usize, input: usize) -> i64 {
        let (k, s, p, d) = (
            g.kernel[i] as i64,
            g.stride[i] as i64,
            g.padding[i] as i64,
            g.dilation[i] as i64,
        );
        let n = input as i64;
        let span = n + 2 * p - d * (k - 1) - 1 + if self.ceil_mode { s - 1 } else { 0 };
        let mut out = span.div_euclid(s) + 1;
        if self.ceil_mode && (out - 1) * s >= n + p {
            out -= 1;
        }
        out
    }

    /// The result type of `name(x)` (`max_pool2d` or `avg_pool2d`) over a 3-D or 4-D input.
    pub fn pool_type(&self, name: &str, x: &TensorType) -> Result<TensorType> {
        let g = self.geometry()?;
        let nd = x.ndim();
        let zero_inner = nd >= 3 && x.shape[nd - 3..].contains(&0);
        if (nd != 3 && nd != 4) || zero_inner {
            bail!(
                Shape,
                "Expected 3D or 4D (batch mode) tensor with optional 0 dim batch size for input, but got:{:?}",
                x.shape
            );
        }
        if name == "max_pool2d" && x.dtype == DType::Bool {
            bail!(DType, "\"{name}\" not implemented for 'Bool'");
        }
        if name == "avg_pool2d" && !x.dtype.is_float() {
            bail!(
                DType,
                "\"{name}\" not implemented for '{}'",
                x.dtype.scalar_name()
            );
        }
        let (c, h, w) = (x.shape[nd - 3], x.shape[nd - 2], x.shape[nd - 1]);
        let (oh, ow) = (self.output_len(&g, 0, h), self.output_len(&g, 1, w));
        if oh < 1 || ow < 1 {
            bail!(
                Shape,
                "Given input size: ({c}x{h}x{w}). Calculated output size: ({c}x{}x{}). Output size is too small",
                oh.max(0),
                ow.max(0)
            );
        }
        let mut shape = x.shape[..nd - 2].to_vec();
        shape.extend([oh as usize, ow as usize]);
        Ok(TensorType::new(x.dtype, shape))
    }
}

/// The result type of `adaptive_avg_pool2d(x, output_size)`.
pub fn adaptive_pool_type(output_size: &[i64], x: &TensorType) -> Result<TensorType> {
    let nd = x.ndim();
    let name = "adaptive_avg_pool2d";
    if nd != 3 && nd != 4 {
        bail!(
            Shape,
            "{name}(): Expected 3D or 4D tensor, but got {:?}",
            x.shape
        );
    }
    for d in 1..nd {
        if x.shape[d] == 0 {
            bail!(
                Shape,
                "{name}(): Expected input to have non-zero size for non-batch dimensions, but input has sizes {:?} with dimension {d} being empty",
                x.shape
            );
        }
    }
    if output_size.len() != 2 {
        bail!(Value, "{name}: output_size must be 2, got {output_size:?}");
    }
    if output_size.iter().any(|&s| s < 0) {
        bail!(
            Value,
            "{name}: elements of output_size must be greater than or equal to 0 but received {{{}, {}}}",
            output_size[0],
            output_size[1]
        );
    }
    if !x.dtype.is_float() {
        bail!(
            DType,
            "\"{name}\" not implemented for '{}'",
            x.dtype.scalar_name()
        );
    }
    let mut shape = x.shape[..nd - 2].to_vec();
    shape.extend(output_size.iter().map(|&s| s as usize));
    Ok(TensorType::new(x.dtype, shape))
}

/// `batch_norm`'s flags: which optional operands follow `x`, the mode and its constants.
#[derive(Clone, Debug, PartialEq, Eq, Hash, serde::Serialize, serde::Deserialize)]
pub struct BatchNormAttrs {
    /// Running mean and variance follow `x` (both or neither).
    pub has_running: bool,
    /// A per-channel weight follows.
    pub has_weight: bool,
    /// A per-channel bias follows.
    pub has_bias: bool,
    /// Normalise with the batch's statistics (the running ones are then updated by the
    /// eager op, never by a graph).
    pub training: bool,
    /// The running statistics' update factor.
    pub momentum: Real,
    /// Added to the variance.
    pub eps: Real,
}

impl BatchNormAttrs {
    /// Positions of the optional operands after `x`: (running mean, running var, weight,
    /// bias), each `None` when absent.
    pub fn positions(&self) -> [Option<usize>; 4] {
        let mut next = 1;
        let mut take = |present: bool| {
            present.then(|| {
                next += 1;
                next - 1
            })
        };
        let rm = take(self.has_running);
        let rv = take(self.has_running);
        let w = take(self.has_weight);
        let b = take(self.has_bias);
        [rm, rv, w, b]
    }

    /// The dims statistics are taken over: every dim but the channels (dim 1).
    pub fn reduced_dims(ndim: usize) -> Vec<usize> {
        (0..ndim).filter(|&d| d != 1).collect()
    }

    /// The result type (x's), with PyTorch's checks.
    pub fn infer(&self, inputs: &[&TensorType]) -> Result<TensorType> {
        let x = inputs[0];
        if x.ndim() < 2 {
            bail!(
                Shape,
                "batch_norm: expected an input with at least 2 dims (N, C, ...), got {:?}",
                x.shape
            );
        }
        if !x.dtype.is_float() {
            bail!(
                DType,
                "\"batch_norm\" not implemented for '{}'",
                x.dtype.scalar_name()
            );
        }
        let c = x.shape[1];
        let names = ["running_mean", "running_var", "weight", "bias"];
        for (name, pos) in names.iter().zip(self.positions()) {
            let Some(p) = pos else { continue };
            let t = inputs[p];
            if t.numel() != c || t.ndim() != 1 {
                bail!(
                    Shape,
                    "{name} should contain {c} elements not {}",
                    t.numel()
                );
            }
            same_dtype(x.dtype, t.dtype)?;
        }
        if !self.training && !self.has_running {
            bail!(
                Value,
                "running_mean and running_var must be defined in evaluation mode"
            );
        }
        let per_channel = x.numel() / c.max(1);
        if self.training && per_channel == 1 {
            bail!(
                Value,
                "Expected more than 1 value per channel when training, got input size {:?}",
                x.shape
            );
        }
        Ok(x.clone())
    }
}

/// Checks a dropout probability (PyTorch's message).
pub fn check_dropout(p: f64) -> Result<()> {
    if !(0.0..=1.0).contains(&p) {
        bail!(
            Value,
            "dropout probability has to be between 0 and 1, but got {p}"
        );
    }
    Ok(())
}

/// Whether element `i` of a dropout with `seed` is kept with probability `1 - p`
/// (`smelt_rt::dropout::keep`: eager tensors, compiled functions and ahead-of-time models
/// draw one mask).
pub use smelt_rt::dropout::keep as dropout_keep;

/// The seed of call `call` (0 for the first) of a compiled dropout written with `seed`
/// (`smelt_rt::dropout::seed_of_call`).
pub use smelt_rt::dropout::seed_of_call as dropout_seed;

#[cfg(test)]
mod tests {
    use super::*;

    fn t(shape: &[usize]) -> TensorType {
        TensorType::new(DType::F32, shape.to_vec())
    }

    #[test]
    fn conv_output_sizes_follow_pytorch() {
        let mut a = ConvAttrs::new(2);
        a.stride = vec![2, 1];
        a.padding = ConvPadding::Explicit(vec![1, 3]);
        a.dilation = vec![1, 2];
        // H: (7 + 2 - 3) / 2 + 1 = 4; W: (5 + 6 - 5) / 1 + 1 = 7
        let y = conv_type(&a, &t(&[2, 4, 7, 5]), &t(&[6, 4, 3, 3]), None).unwrap();
        assert_eq!(y.shape, vec![2, 6, 4, 7]);
        a.padding = ConvPadding::Same;
        a.stride = vec![1, 1];
        let g = a.geometry(&[4, 3]).unwrap();
        // total padding 3 and 4: the odd one puts the extra zero at the end
        assert_eq!((g.pad_lo, g.pad_hi), (vec![1, 2], vec![2, 2]));
    }

    #[test]
    fn pool_ceil_mode_drops_a_window_starting_in_the_padding() {
        let mut p = PoolAttrs::new(&[3, 3]);
        p.stride = vec![2, 2];
        p.padding = vec![1, 1];
        p.ceil_mode = true;
        assert_eq!(
            p.pool_type("max_pool2d", &t(&[1, 1, 6, 6])).unwrap().shape,
            vec![1, 1, 4, 4]
        );
        let mut q = PoolAttrs::new(&[2, 2]);
        q.ceil_mode = true;
        assert_eq!(
            q.pool_type("max_pool2d", &t(&[1, 1, 5, 5])).unwrap().shape,
            vec![1, 1, 3, 3]
        );
    }

    #[test]
    fn malformed_attributes_are_errors_not_panics() {
        let mut a = ConvAttrs::new(2);
        a.dilation = vec![1];
        assert!(a.geometry(&[3, 3]).is_err());
        assert!(ConvAttrs::new(3).geometry(&[1, 1, 1]).is_err());
        assert!(PoolAttrs::new(&[3]).geometry().is_err());
        assert!(adaptive_pool_type(&[2], &t(&[1, 2, 4, 4])).is_err());
    }

    #[test]
    fn dropout_keeps_about_one_minus_p() {
        let kept = (0..100_000).filter(|&i| dropout_keep(7, i, 0.3)).count();
        assert!((kept as f64 / 1e5 - 0.7).abs() < 0.01, "{kept}");
        assert!((0..1000).all(|i| dropout_keep(7, i, 0.0)));
        assert!((0..1000).all(|i| !dropout_keep(7, i, 1.0)));
    }
}
