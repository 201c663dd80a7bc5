//! The methods of `Tensor`, one file per op family.

mod creation;
mod linalg;
mod reduce;
mod views;
