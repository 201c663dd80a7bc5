//! The layers of convolutional networks: `Conv1d`, `Conv2d`, `BatchNorm1d`/`BatchNorm2d`,
//! `MaxPool2d`, `AvgPool2d`, `AdaptiveAvgPool2d` and `Flatten`.

use crate::nn::Module;
use crate::nn::init::{self, FanMode, Nonlinearity};
use crate::nn::module::stateless_module;
use crate::runtime::{ConvOptions, PoolOptions, Tensor};
use crate::{DType, Result, bail};

/// A convolution over 1 or 2 spatial dims with PyTorch's initialisation.
struct ConvLayer {
    weight: Tensor,
    bias: Option<Tensor>,
    opts: ConvOptions,
    training: bool,
}

impl ConvLayer {
    /// `kaiming_uniform_(W, a=√5)` and a bias from U(-1/√fan_in, 1/√fan_in), as
    /// `nn.Conv2d.reset_parameters`.
    fn new(
        in_channels: usize,
        out_channels: usize,
        kernel: &[usize],
        opts: ConvOptions,
        groups: usize,
        bias: bool,
    ) -> Result<ConvLayer> {
        if groups == 0 || !in_channels.is_multiple_of(groups) {
            bail!(Value, "in_channels must be divisible by groups");
        }
        if !out_channels.is_multiple_of(groups) {
            bail!(Value, "out_channels must be divisible by groups");
        }
        let mut shape = vec![out_channels, in_channels / groups];
        shape.extend_from_slice(kernel);
        let weight = parameter(&shape)?;
        init::kaiming_uniform_(
            &weight,
            5f64.sqrt(),
            FanMode::FanIn,
            Nonlinearity::LeakyRelu(0.0),
        )?;
        let bias = if bias {
            let b = parameter(&[out_channels])?;
            let (fan_in, _) = init::calculate_fan_in_and_fan_out(&weight)?;
            let bound = if fan_in > 0 {
                1.0 / (fan_in as f64).sqrt()
            } else {
                0.0
            };
            init::uniform_(&b, -bound, bound)?;
            Some(b)
        } else {
            None
        };
        Ok(ConvLayer {
            weight,
            bias,
            opts: opts.groups(groups as i64),
            training: true,
        })
    }

    fn named_parameters(&self) -> Vec<(String, Tensor)> {
        let mut v = vec![("weight".to_string(), self.weight.clone())];
        if let Some(b) = &self.bias {
            v.push(("bias".to_string(), b.clone()));
        }
        v
    }
}

fn parameter(shape: &[usize]) -> Result<Tensor> {
    let p = Tensor::zeros(shape, DType::F32);
    p.requires_grad_(true)?;
    Ok(p)
}

macro_rules! conv_module {
    ($name:ident, $torch:literal, $method:ident, $dims:literal) => {
        #[doc = concat!("`nn.", $torch, "`: weight `[out, in / groups, *kernel]`, bias `[out]`.")]
        pub struct $name {
            layer: ConvLayer,
        }

        impl $name {
            #[doc = concat!("A layer of `kernel_size` (", $dims, " sizes) initialised as PyTorch's; ")]
            /// `opts` carries stride, padding and dilation, `groups` splits the channels.
            pub fn new(
                in_channels: usize,
                out_channels: usize,
                kernel_size: [usize; $dims],
                opts: ConvOptions,
                groups: usize,
                bias: bool,
            ) -> Result<$name> {
                Ok($name {
                    layer: ConvLayer::new(
                        in_channels,
                        out_channels,
                        &kernel_size,
                        opts,
                        groups,
                        bias,
                    )?,
                })
            }

            /// The weight.
            pub fn weight(&self) -> &Tensor {
                &self.layer.weight
            }

            /// The bias, when the layer has one.
            pub fn bias(&self) -> Option<&Tensor> {
                self.layer.bias.as_ref()
            }
        }

        impl Module for $name {
            fn forward(&self, x: &Tensor) -> Result<Tensor> {
                let l = &self.layer;
                x.$method(&l.weight, l.bias.as_ref(), &l.opts)
            }
            fn named_parameters(&self) -> Vec<(String, Tensor)> {
                self.layer.named_parameters()
            }
            fn train(&mut self, mode: bool) {
                self.layer.training = mode;
            }
            fn is_training(&self) -> bool {
                self.layer.training
            }
        }
    };
}

conv_module!(Conv1d, "Conv1d", conv1d, 1);
conv_module!(Conv2d, "Conv2d", conv2d, 2);

/// Batch normalisation over the channels (dim 1), with running statistics.
pub struct BatchNorm {
    /// Ones at creation, when `affine`.
    pub weight: Option<Tensor>,
    /// Zeros at creation, when `affine`.
    pub bias: Option<Tensor>,
    /// The running mean (zeros at creation), a buffer.
    pub running_mean: Tensor,
    /// The running variance (ones at creation), a buffer.
    pub running_var: Tensor,
    /// How many training batches updated the statistics, a buffer (`i64[]`).
    pub num_batches_tracked: Tensor,
    /// Added to the variance (PyTorch: `1e-5`).
    pub eps: f64,
    /// The running statistics' update factor (PyTorch: 0.1).
    pub momentum: f64,
    /// The input ranks this layer accepts (`[2, 3]` for 1-d, `[4]` for 2-d).
    ranks: &'static [usize],
    training: bool,
}

/// `nn.BatchNorm1d`: inputs `[N, C]` or `[N, C, L]`.
pub type BatchNorm1d = BatchNorm;
/// `nn.BatchNorm2d`: inputs `[N, C, H, W]`.
pub type BatchNorm2d = BatchNorm;

impl BatchNorm {
    fn with_ranks(num_features: usize, ranks: &'static [usize]) -> Result<BatchNorm> {
        let w = parameter(&[num_features])?;
        init::ones_(&w)?;
        Ok(BatchNorm {
            weight: Some(w),
            bias: Some(parameter(&[num_features])?),
            running_mean: Tensor::zeros(&[num_features], DType::F32),
            running_var: Tensor::ones(&[num_features], DType::F32),
            num_batches_tracked: Tensor::scalar(0i64),
            eps: 1e-5,
            momentum: 0.1,
            ranks,
            training: true,
        })
    }

    /// `nn.BatchNorm1d(num_features)` (eps 1e-5, momentum 0.1, affine).
    pub fn new_1d(num_features: usize) -> Result<BatchNorm> {
        BatchNorm::with_ranks(num_features, &[2, 3])
    }

    /// `nn.BatchNorm2d(num_features)` (eps 1e-5, momentum 0.1, affine).
    pub fn new_2d(num_features: usize) -> Result<BatchNorm> {
        BatchNorm::with_ranks(num_features, &[4])
    }

    /// Without weight and bias (`affine=False`).
    pub fn without_affine(mut self) -> BatchNorm {
        self.weight = None;
        self.bias = None;
        self
    }
}

impl Module for BatchNorm {
    fn forward(&self, x: &Tensor) -> Result<Tensor> {
        if !self.ranks.contains(&x.dim()) {
            let want = if self.ranks == [4] { "4D" } else { "2D or 3D" };
            bail!(Shape, "expected {want} input (got {}D input)", x.dim());
        }
        if self.training {
            let _g = crate::autograd::no_grad();
            self.num_batches_tracked.add_scalar_(1i64)?;
        }
        crate::nn::functional::batch_norm(
            x,
            Some(&self.running_mean),
            Some(&self.running_var),
            self.weight.as_ref(),
            self.bias.as_ref(),
            self.training,
            self.momentum,
            self.eps,
        )
    }
    fn named_parameters(&self) -> Vec<(String, Tensor)> {
        let mut v = Vec::new();
        if let Some(w) = &self.weight {
            v.push(("weight".to_string(), w.clone()));
        }
        if let Some(b) = &self.bias {
            v.push(("bias".to_string(), b.clone()));
        }
        v
    }
    fn named_buffers(&self) -> Vec<(String, Tensor)> {
        vec![
            ("running_mean".into(), self.running_mean.clone()),
            ("running_var".into(), self.running_var.clone()),
            (
                "num_batches_tracked".into(),
                self.num_batches_tracked.clone(),
            ),
        ]
    }
    fn train(&mut self, mode: bool) {
        self.training = mode;
    }
    fn is_training(&self) -> bool {
        self.training
    }
}

/// `nn.MaxPool2d`.
pub struct MaxPool2d {
    /// Window, stride, padding, dilation, ceil_mode.
    pub opts: PoolOptions,
    training: bool,
}

impl MaxPool2d {
    /// Pooling with `opts` (`PoolOptions::new(3).stride(2).padding(1)`).
    pub fn new(opts: PoolOptions) -> MaxPool2d {
        MaxPool2d {
            opts,
            training: true,
        }
    }
}
stateless_module!(MaxPool2d, |s, x| x.max_pool2d(&s.opts));

/// `nn.AvgPool2d`.
pub struct AvgPool2d {
    /// Window, stride, padding, ceil_mode, count_include_pad.
    pub opts: PoolOptions,
    training: bool,
}

impl AvgPool2d {
    /// Pooling with `opts`.
    pub fn new(opts: PoolOptions) -> AvgPool2d {
        AvgPool2d {
            opts,
            training: true,
        }
    }
}
stateless_module!(AvgPool2d, |s, x| x.avg_pool2d(&s.opts));

/// `nn.AdaptiveAvgPool2d`: averages over windows that tile the input into `output_size`.
pub struct AdaptiveAvgPool2d {
    /// Output height and width.
    pub output_size: [usize; 2],
    training: bool,
}

impl AdaptiveAvgPool2d {
    /// Pooling to `output_size` (`[1, 1]`: global average pooling).
    pub fn new(output_size: [usize; 2]) -> AdaptiveAvgPool2d {
        AdaptiveAvgPool2d {
            output_size,
            training: true,
        }
    }
}
stateless_module!(AdaptiveAvgPool2d, |s, x| x
    .adaptive_avg_pool2d(s.output_size));

/// `nn.Flatten`: dims `start_dim..=end_dim` into one (PyTorch's defaults: 1 and -1).
pub struct Flatten {
    /// First dim flattened.
    pub start_dim: i64,
    /// Last dim flattened.
    pub end_dim: i64,
    training: bool,
}

impl Default for Flatten {
    fn default() -> Flatten {
        Flatten::new(1, -1)
    }
}

impl Flatten {
    /// Flattens `start_dim..=end_dim`.
    pub fn new(start_dim: i64, end_dim: i64) -> Flatten {
        Flatten {
            start_dim,
            end_dim,
            training: true,
        }
    }
}
stateless_module!(Flatten, |s, x| x.flatten(s.start_dim, s.end_dim));
