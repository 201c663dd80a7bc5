//! The methods of `Tensor`, one file per op family.

mod creation;
mod device;
mod einsum;
mod index;
mod inplace;
mod linalg;
mod pointwise;
mod reduce;
mod views;

pub use pointwise::ClampBound;
