//! The methods of `Tensor`, one file per op family.

mod creation;
mod index;
mod views;
