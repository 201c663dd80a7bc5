//! The `Module` trait: a forward function plus the parameters it owns.

use crate::Result;
use crate::jit::{TraceOptions, Traced, trace_with};
use crate::runtime::Tensor;

/// Traces `module.forward` on `example` with the module's parameters as graph inputs (named
/// as `named_parameters` names them), as `torch.jit.trace(model, example)` keeps them
/// parameters: the graph holds no copy of the weights, and calls see in-place updates of
/// them. (`jit::trace` of a closure that captures the module bakes every weight in as a
/// constant instead.)
pub fn trace_module<'m, M: Module>(module: &'m M, example: &Tensor) -> Result<Traced<'m>> {
    let named = module.named_parameters();
    let opts = named
        .iter()
        .fold(TraceOptions::default().input_names(&["x"]), |o, (n, t)| {
            o.param(n, t)
        });
    trace_with(
        move |xs: &[Tensor]| Ok(vec![module.forward(&xs[0])?]),
        std::slice::from_ref(example),
        opts,
    )
}

/// A layer or model (`torch.nn.Module`).
///
/// Parameters are shared tensors: the tensors `named_parameters` returns are the module's
/// own, so an optimiser that updates them in place updates the module.
pub trait Module: Send {
    /// Runs the module on `x`.
    fn forward(&self, x: &Tensor) -> Result<Tensor>;

    /// The parameters with their dotted names (`weight`, `0.bias`), in registration order.
    fn named_parameters(&self) -> Vec<(String, Tensor)>;

    /// State that is not a parameter (`BatchNorm`'s running statistics), with dotted
    /// names; saved in the state dict after the parameters. None by default.
    fn named_buffers(&self) -> Vec<(String, Tensor)> {
        Vec::new()
    }

    /// Switches training mode on or off (`module.train(mode)`), recursively.
    fn train(&mut self, mode: bool);

    /// Whether the module is in training mode (`module.training`).
    fn is_training(&self) -> bool;

    /// Evaluation mode (`module.eval()`): dropout becomes the identity.
    fn eval(&mut self) {
        self.train(false);
    }

    /// The parameters without their names.
    fn parameters(&self) -> Vec<Tensor> {
        self.named_parameters()
            .into_iter()
            .map(|(_, p)| p)
            .collect()
    }

    /// Clears every parameter's gradient (`zero_grad(set_to_none=True)`, PyTorch's default).
    fn zero_grad(&self) {
        for p in self.parameters() {
            p.set_grad(None);
        }
    }

    /// The number of parameter elements.
    fn num_parameters(&self) -> usize {
        self.parameters().iter().map(Tensor::numel).sum()
    }
}

impl<M: Module + ?Sized> Module for Box<M> {
    fn forward(&self, x: &Tensor) -> Result<Tensor> {
        (**self).forward(x)
    }
    fn named_parameters(&self) -> Vec<(String, Tensor)> {
        (**self).named_parameters()
    }
    fn named_buffers(&self) -> Vec<(String, Tensor)> {
        (**self).named_buffers()
    }
    fn train(&mut self, mode: bool) {
        (**self).train(mode)
    }
    fn is_training(&self) -> bool {
        (**self).is_training()
    }
}

/// `impl Module` for a layer without parameters whose forward is `|self, x| body`; the
/// struct has a `training: bool` field.
macro_rules! stateless_module {
    ($name:ident, |$s:ident, $x:ident| $body:expr) => {
        impl $crate::nn::Module for $name {
            fn forward(
                &self,
                $x: &$crate::runtime::Tensor,
            ) -> $crate::Result<$crate::runtime::Tensor> {
                let $s = self;
                $body
            }
            fn named_parameters(&self) -> Vec<(String, $crate::runtime::Tensor)> {
                Vec::new()
            }
            fn train(&mut self, mode: bool) {
                self.training = mode;
            }
            fn is_training(&self) -> bool {
                self.training
            }
        }
    };
}
pub(crate) use stateless_module;
