//! The methods of `Tensor`, one file per op family.

mod cnn;
mod creation;
mod data;
mod device;
mod einsum;
mod index;
mod inplace;
mod linalg;
mod pointwise;
mod reduce;
mod views;

pub use cnn::{ConvOptions, IntoSizes, MemoryFormat, PoolOptions};
pub use pointwise::ClampBound;
