//! The methods of `Tensor`, one file per op family.

mod creation;
mod linalg;
mod pointwise;
mod reduce;
mod views;
