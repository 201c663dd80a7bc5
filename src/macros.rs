//! The `tensor!` macro and `Nested`, the nested-list data it is built on.

use crate::ir::dtype::{DEFAULT_FLOAT, DType, Scalar};
use crate::runtime::tensor::Tensor;
use crate::{Result, bail, dispatch};

/// A tensor literal: `tensor![[1., 2.], [3., 4.]]` is `torch.tensor([[1., 2.], [3., 4.]])`.
///
/// Returns `Result<Tensor>`: ragged input (`tensor![[1, 2], [3]]`) is an error, as in
/// PyTorch. The dtype follows the values: any float makes f32, else any integer makes i64,
/// else bool; `tensor![]` is an empty f32 tensor. Elements may be any expressions that
/// convert into `Nested` (numbers, bools, `Vec`s, arrays). For a 0-d tensor use
/// `Tensor::scalar`.
#[macro_export]
macro_rules! tensor {
    ($($body:tt)*) => {
        $crate::Tensor::from_nested($crate::__tensor_nested!([$($body)*]))
    };
}

/// Turns a bracketed literal into a `Nested` value (the body of `tensor!`).
#[doc(hidden)]
#[macro_export]
macro_rules! __tensor_nested {
    ([$([$($inner:tt)*]),+ $(,)?]) => {
        $crate::macros::Nested::List(vec![$($crate::__tensor_nested!([$($inner)*])),+])
    };
    ([$($e:expr),* $(,)?]) => {
        $crate::macros::Nested::List(vec![$($crate::macros::Nested::from($e)),*])
    };
}

/// A number, a bool, or a list of `Nested` values: the data of a tensor literal before its
/// shape has been checked.
#[derive(Clone, Debug, PartialEq)]
pub enum Nested {
    /// One number or bool.
    Leaf(Scalar),
    /// A bracketed list of nested values.
    List(Vec<Nested>),
}

impl Nested {
    /// The shape (read along the first elements) and the elements in row-major order.
    /// Fails with PyTorch's message when the lists are ragged.
    pub fn shape_and_data(&self) -> Result<(Vec<usize>, Vec<Scalar>)> {
        let mut shape = Vec::new();
        let mut cur = self;
        while let Nested::List(items) = cur {
            shape.push(items.len());
            match items.first() {
                Some(first) => cur = first,
                None => break,
            }
        }
        let mut data = Vec::with_capacity(shape.iter().product());
        self.flatten_into(0, &shape, &mut data)?;
        Ok((shape, data))
    }

    fn flatten_into(&self, dim: usize, shape: &[usize], out: &mut Vec<Scalar>) -> Result<()> {
        match self {
            Nested::Leaf(s) if dim == shape.len() => out.push(*s),
            Nested::Leaf(_) => bail!(Value, "expected a sequence at dim {dim}, got a number"),
            Nested::List(_) if dim == shape.len() => {
                bail!(Value, "expected a number at dim {dim}, got a sequence")
            }
            Nested::List(items) => {
                if items.len() != shape[dim] {
                    bail!(
                        Value,
                        "expected sequence of length {} at dim {dim} (got {})",
                        shape[dim],
                        items.len()
                    );
                }
                for item in items {
                    item.flatten_into(dim + 1, shape, out)?;
                }
            }
        }
        Ok(())
    }
}

/// The dtype `torch.tensor` infers: float beats int beats bool; empty data is f32.
fn infer_dtype(data: &[Scalar]) -> DType {
    if data.iter().any(|s| s.is_float()) {
        DEFAULT_FLOAT
    } else if data.iter().any(|s| matches!(s, Scalar::Int(_))) {
        DType::I64
    } else if data.is_empty() {
        DEFAULT_FLOAT
    } else {
        DType::Bool
    }
}

impl Tensor {
    /// `torch.tensor(data)` for nested lists: the shape comes from the nesting, the dtype
    /// from the values (f32, i64 or bool). What `tensor!` expands to.
    pub fn from_nested(data: impl Into<Nested>) -> Result<Tensor> {
        let (shape, values) = data.into().shape_and_data()?;
        let dtype = infer_dtype(&values);
        Ok(dispatch!(dtype, T => Tensor::from_data(
            values.iter().map(|&s| crate::runtime::kernels::creation::scalar_to::<T>(s)).collect::<Vec<T>>(),
            &shape,
        )))
    }
}

macro_rules! nested_leaf {
    ($($t:ty => $v:ident as $c:ty),*) => {$(
        impl From<$t> for Nested {
            fn from(x: $t) -> Nested {
                Nested::Leaf(Scalar::$v(x as $c))
            }
        }
    )*};
}
nested_leaf!(f32 => Float as f64, f64 => Float as f64, i8 => Int as i64, i16 => Int as i64,
    i32 => Int as i64, i64 => Int as i64, u8 => Int as i64, u16 => Int as i64, u32 => Int as i64);

impl From<bool> for Nested {
    fn from(b: bool) -> Nested {
        Nested::Leaf(Scalar::Bool(b))
    }
}

impl From<Scalar> for Nested {
    fn from(s: Scalar) -> Nested {
        Nested::Leaf(s)
    }
}

impl<T: Into<Nested>> From<Vec<T>> for Nested {
    fn from(v: Vec<T>) -> Nested {
        Nested::List(v.into_iter().map(Into::into).collect())
    }
}

impl<T: Into<Nested>, const N: usize> From<[T; N]> for Nested {
    fn from(v: [T; N]) -> Nested {
        Nested::List(v.into_iter().map(Into::into).collect())
    }
}
