//! Convolutions, pooling, batch normalisation, dropout and memory formats on `Tensor`.

use crate::ir::conv::{BatchNormAttrs, ConvAttrs, ConvPadding, PoolAttrs, spatial_list};
use crate::ir::op::Op;
use crate::ir::unary::Real;
use crate::runtime::device::Device;
use crate::runtime::kernels::conv::{is_channels_last, prefers_nhwc};
use crate::runtime::random::with_global;
use crate::runtime::tensor::{Tensor, apply};
use crate::{Result, bail};

/// Sizes given as one int (the same for every spatial dim) or one per dim.
pub trait IntoSizes {
    /// The sizes as written.
    fn into_sizes(self) -> Vec<i64>;
}

impl IntoSizes for i64 {
    fn into_sizes(self) -> Vec<i64> {
        vec![self]
    }
}
impl IntoSizes for usize {
    fn into_sizes(self) -> Vec<i64> {
        vec![self as i64]
    }
}
impl IntoSizes for i32 {
    fn into_sizes(self) -> Vec<i64> {
        vec![self as i64]
    }
}
impl<const N: usize> IntoSizes for [i64; N] {
    fn into_sizes(self) -> Vec<i64> {
        self.to_vec()
    }
}
impl<const N: usize> IntoSizes for [i32; N] {
    fn into_sizes(self) -> Vec<i64> {
        self.iter().map(|&x| x as i64).collect()
    }
}
impl<const N: usize> IntoSizes for [usize; N] {
    fn into_sizes(self) -> Vec<i64> {
        self.iter().map(|&x| x as i64).collect()
    }
}
impl IntoSizes for &[i64] {
    fn into_sizes(self) -> Vec<i64> {
        self.to_vec()
    }
}
impl IntoSizes for Vec<i64> {
    fn into_sizes(self) -> Vec<i64> {
        self
    }
}

/// The keyword arguments of `F.conv1d`/`F.conv2d`, with PyTorch's defaults:
/// `ConvOptions::default().stride(2).padding(1)`, `.padding_same()`, `.groups(c)`.
#[derive(Clone, Debug, PartialEq)]
pub struct ConvOptions {
    stride: Vec<i64>,
    padding: ConvPadding,
    dilation: Vec<i64>,
    groups: i64,
}

impl Default for ConvOptions {
    fn default() -> ConvOptions {
        ConvOptions {
            stride: vec![1],
            padding: ConvPadding::Explicit(vec![0]),
            dilation: vec![1],
            groups: 1,
        }
    }
}

impl ConvOptions {
    /// `stride=`.
    pub fn stride(mut self, s: impl IntoSizes) -> Self {
        self.stride = s.into_sizes();
        self
    }
    /// `padding=` as sizes.
    pub fn padding(mut self, p: impl IntoSizes) -> Self {
        self.padding = ConvPadding::Explicit(p.into_sizes());
        self
    }
    /// `padding="same"`.
    pub fn padding_same(mut self) -> Self {
        self.padding = ConvPadding::Same;
        self
    }
    /// `padding="valid"`.
    pub fn padding_valid(mut self) -> Self {
        self.padding = ConvPadding::Valid;
        self
    }
    /// `dilation=`.
    pub fn dilation(mut self, d: impl IntoSizes) -> Self {
        self.dilation = d.into_sizes();
        self
    }
    /// `groups=`.
    pub fn groups(mut self, g: i64) -> Self {
        self.groups = g;
        self
    }
    /// The op attributes for `n` spatial dims.
    pub fn attrs(&self, n: usize) -> Result<ConvAttrs> {
        Ok(ConvAttrs {
            stride: spatial_list("stride", &self.stride, n)?,
            padding: match &self.padding {
                ConvPadding::Explicit(p) => ConvPadding::Explicit(spatial_list("padding", p, n)?),
                p => p.clone(),
            },
            dilation: spatial_list("dilation", &self.dilation, n)?,
            groups: self.groups,
        })
    }
}

/// The keyword arguments of `F.max_pool2d`/`F.avg_pool2d`: `PoolOptions::new(3).stride(2)
/// .padding(1)`; the stride defaults to the window.
#[derive(Clone, Debug, PartialEq)]
pub struct PoolOptions {
    kernel_size: Vec<i64>,
    stride: Option<Vec<i64>>,
    padding: Vec<i64>,
    dilation: Vec<i64>,
    ceil_mode: bool,
    count_include_pad: bool,
}

impl PoolOptions {
    /// A window of `kernel_size` (one int or two).
    pub fn new(kernel_size: impl IntoSizes) -> PoolOptions {
        PoolOptions {
            kernel_size: kernel_size.into_sizes(),
            stride: None,
            padding: vec![0],
            dilation: vec![1],
            ceil_mode: false,
            count_include_pad: true,
        }
    }
    /// `stride=`.
    pub fn stride(mut self, s: impl IntoSizes) -> Self {
        self.stride = Some(s.into_sizes());
        self
    }
    /// `padding=`.
    pub fn padding(mut self, p: impl IntoSizes) -> Self {
        self.padding = p.into_sizes();
        self
    }
    /// `dilation=` (max pooling only).
    pub fn dilation(mut self, d: impl IntoSizes) -> Self {
        self.dilation = d.into_sizes();
        self
    }
    /// `ceil_mode=`.
    pub fn ceil_mode(mut self, on: bool) -> Self {
        self.ceil_mode = on;
        self
    }
    /// `count_include_pad=` (average pooling only; default true).
    pub fn count_include_pad(mut self, on: bool) -> Self {
        self.count_include_pad = on;
        self
    }
    fn attrs(&self) -> Result<PoolAttrs> {
        let kernel_size = spatial_list("kernel_size", &self.kernel_size, 2)?;
        Ok(PoolAttrs {
            stride: match &self.stride {
                Some(s) if !s.is_empty() => spatial_list("stride", s, 2)?,
                _ => kernel_size.clone(),
            },
            padding: spatial_list("padding", &self.padding, 2)?,
            dilation: spatial_list("dilation", &self.dilation, 2)?,
            ceil_mode: self.ceil_mode,
            kernel_size,
        })
    }
}

/// How a 4-D tensor's elements are ordered in memory (`torch.memory_format`).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum MemoryFormat {
    /// Row-major NCHW (`torch.contiguous_format`).
    Contiguous,
    /// NHWC: the channels of a pixel next to each other (`torch.channels_last`), what
    /// convolution kernels read fastest.
    ChannelsLast,
}

impl Tensor {
    fn conv(
        &self,
        n: usize,
        weight: &Tensor,
        bias: Option<&Tensor>,
        o: &ConvOptions,
    ) -> Result<Tensor> {
        let mut inputs = vec![self, weight];
        inputs.extend(bias);
        let op = Op::Conv {
            conv: o.attrs(n)?,
            has_bias: bias.is_some(),
        };
        apply(op, &inputs)
    }

    /// `F.conv1d(x, weight, bias, ...)`: x `[N, C, L]` (or `[C, L]`), weight
    /// `[C_out, C / groups, k]`.
    pub fn conv1d(
        &self,
        weight: &Tensor,
        bias: Option<&Tensor>,
        opts: &ConvOptions,
    ) -> Result<Tensor> {
        self.conv(1, weight, bias, opts)
    }

    /// `F.conv2d(x, weight, bias, ...)`: x `[N, C, H, W]` (or `[C, H, W]`), weight
    /// `[C_out, C / groups, kH, kW]`. A channels_last input gives a channels_last result.
    pub fn conv2d(
        &self,
        weight: &Tensor,
        bias: Option<&Tensor>,
        opts: &ConvOptions,
    ) -> Result<Tensor> {
        self.conv(2, weight, bias, opts)
    }

    /// `F.max_pool2d(x, kernel_size, stride, padding, dilation, ceil_mode)`.
    pub fn max_pool2d(&self, opts: &PoolOptions) -> Result<Tensor> {
        apply(
            Op::MaxPool2d {
                pool: opts.attrs()?,
            },
            &[self],
        )
    }

    /// `F.avg_pool2d(x, kernel_size, stride, padding, ceil_mode, count_include_pad)`.
    pub fn avg_pool2d(&self, opts: &PoolOptions) -> Result<Tensor> {
        if opts.dilation.iter().any(|&d| d != 1) {
            bail!(
                Value,
                "avg_pool2d() got an unexpected keyword argument 'dilation'"
            );
        }
        let op = Op::AvgPool2d {
            pool: opts.attrs()?,
            count_include_pad: opts.count_include_pad,
        };
        apply(op, &[self])
    }

    /// `F.adaptive_avg_pool2d(x, output_size)`.
    pub fn adaptive_avg_pool2d(&self, output_size: impl IntoSizes) -> Result<Tensor> {
        let output_size = spatial_list("output_size", &output_size.into_sizes(), 2)?;
        apply(Op::AdaptiveAvgPool2d { output_size }, &[self])
    }

    /// `batch_norm(x, running_mean, running_var, weight, bias, training, momentum, eps)`
    /// over dim 1, the graph op: training normalises with the batch's statistics,
    /// evaluation with the running ones. It leaves the running statistics alone;
    /// [`crate::nn::functional::batch_norm`] (and `nn::BatchNorm2d`) also update them, as
    /// PyTorch's `F.batch_norm`.
    #[allow(clippy::too_many_arguments)]
    pub fn batch_norm(
        &self,
        running_mean: Option<&Tensor>,
        running_var: Option<&Tensor>,
        weight: Option<&Tensor>,
        bias: Option<&Tensor>,
        training: bool,
        momentum: f64,
        eps: f64,
    ) -> Result<Tensor> {
        if running_mean.is_some() != running_var.is_some() {
            bail!(
                Value,
                "batch_norm: give both running_mean and running_var, or neither"
            );
        }
        let bn = BatchNormAttrs {
            has_running: running_mean.is_some(),
            has_weight: weight.is_some(),
            has_bias: bias.is_some(),
            training,
            momentum: Real(momentum),
            eps: Real(eps),
        };
        let mut inputs = vec![self];
        inputs.extend(running_mean);
        inputs.extend(running_var);
        inputs.extend(weight);
        inputs.extend(bias);
        apply(Op::BatchNorm(bn), &inputs)
    }

    /// `F.dropout(x, p, training)`: zeroes each element with probability `p` and scales the
    /// rest by `1 / (1 - p)`. The mask is drawn from the global generator's next seed
    /// ([`crate::runtime::random::manual_seed`] makes it reproducible); evaluation mode
    /// returns a copy.
    pub fn dropout(&self, p: f64, training: bool) -> Result<Tensor> {
        let seed = if training {
            with_global(|g| g.next_seed())
        } else {
            0
        };
        self.dropout_seeded(p, training, seed)
    }

    /// `dropout` with an explicit mask seed: the same seed gives the same mask on every
    /// backend, eagerly and compiled.
    pub fn dropout_seeded(&self, p: f64, training: bool, seed: u64) -> Result<Tensor> {
        let op = Op::Dropout {
            p: Real(p),
            training,
            seed,
        };
        apply(op, &[self])
    }

    /// The memory format of a 4-D tensor: channels_last when its strides are NHWC's
    /// (PyTorch's `suggest_memory_format`), else contiguous.
    pub fn suggest_memory_format(&self) -> MemoryFormat {
        if prefers_nhwc(self) {
            MemoryFormat::ChannelsLast
        } else {
            MemoryFormat::Contiguous
        }
    }

    /// Whether the elements are laid out in `fmt` (`x.is_contiguous(memory_format=..)`).
    pub fn is_contiguous_format(&self, fmt: MemoryFormat) -> bool {
        match fmt {
            MemoryFormat::Contiguous => self.is_contiguous(),
            MemoryFormat::ChannelsLast => {
                self.dim() == 4 && is_channels_last(self.shape(), self.strides())
            }
        }
    }

    /// `x.contiguous(memory_format=fmt)`: `x` itself when already in `fmt`, else a copy in
    /// `fmt` (channels_last needs a 4-D tensor).
    pub fn contiguous_format(&self, fmt: MemoryFormat) -> Result<Tensor> {
        if self.is_contiguous_format(fmt) {
            return Ok(self.clone());
        }
        self.to_memory_format(fmt)
    }

    /// `x.to(memory_format=fmt)`: the same values laid out in `fmt`, through a recorded
    /// copy (gradients flow through it); `x` itself when its suggested format already is
    /// `fmt`. As in PyTorch, a tensor whose strides say both formats (one channel, or one
    /// pixel) is copied to channels_last strides (`[2, 1, 3, 3]`: `[9, 1, 3, 1]`), so that
    /// the kernels after it run in NHWC.
    pub fn to_memory_format(&self, fmt: MemoryFormat) -> Result<Tensor> {
        match fmt {
            MemoryFormat::Contiguous => self.contiguous(),
            MemoryFormat::ChannelsLast => {
                if self.dim() != 4 {
                    bail!(
                        Shape,
                        "required rank 4 tensor to use channels_last format, got a tensor of size {:?}",
                        self.shape()
                    );
                }
                if self.suggest_memory_format() == fmt {
                    return Ok(self.clone());
                }
                if self.is_contiguous_format(fmt) && self.device() == Device::Cpu {
                    // dense in both formats: the permuted view below is contiguous already,
                    // so copy into fresh channels_last storage (copy_ is recorded)
                    let s = self.shape();
                    let nhwc = Tensor::empty(&[s[0], s[2], s[3], s[1]], self.dtype())
                        .permute(&[0, 3, 1, 2])?;
                    nhwc.copy_(self)?;
                    return Ok(nhwc);
                }
                // an NHWC copy seen through NCHW strides: permute, copy, permute back
                let nhwc = self.permute(&[0, 2, 3, 1])?.contiguous()?;
                nhwc.permute(&[0, 3, 1, 2])
            }
        }
    }
}
