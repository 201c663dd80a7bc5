//! `Args`: the `name=value` attributes of one call, read and checked as an op's
//! constructor asks for them.

use super::{Attr, CallResult, err};
use crate::ir::conv::{ConvAttrs, ConvPadding, PoolAttrs};
use crate::ir::dtype::{DType, Scalar};

/// The attributes of one call, consumed as the op's constructor reads them.
pub(super) struct Args<'a> {
    pub(super) op: &'a str,
    pub(super) attrs: Vec<(&'a str, &'a Attr)>,
}

impl<'a> Args<'a> {
    pub(super) fn take(&mut self, name: &str) -> Option<&'a Attr> {
        let i = self.attrs.iter().position(|(n, _)| *n == name)?;
        Some(self.attrs.remove(i).1)
    }

    pub(super) fn bad<T>(&self, name: &str, want: &str, got: &Attr) -> CallResult<T> {
        err(
            Some(name),
            format!(
                "attribute '{name}' of '{}' expects {want}, got {} ({got})",
                self.op,
                got.kind()
            ),
        )
    }

    pub(super) fn missing<T>(&self, name: &str) -> CallResult<T> {
        err(
            None,
            format!("'{}' requires the attribute '{name}'", self.op),
        )
    }

    pub(super) fn int_of(&self, name: &str, a: &Attr) -> CallResult<i64> {
        match a {
            Attr::Int(i) => Ok(*i),
            Attr::Bool(b) => Ok(*b as i64),
            _ => self.bad(name, "an int", a),
        }
    }

    pub(super) fn int(&mut self, name: &str, default: Option<i64>) -> CallResult<i64> {
        match (self.take(name), default) {
            (Some(a), _) => self.int_of(name, a),
            (None, Some(d)) => Ok(d),
            (None, None) => self.missing(name),
        }
    }

    pub(super) fn opt_int(&mut self, name: &str) -> CallResult<Option<i64>> {
        match self.take(name) {
            None | Some(Attr::None) => Ok(None),
            Some(a) => self.int_of(name, a).map(Some),
        }
    }

    pub(super) fn float(&mut self, name: &str, default: f64) -> CallResult<f64> {
        match self.take(name) {
            None => Ok(default),
            Some(Attr::Float(x)) => Ok(*x),
            Some(Attr::Int(i)) => Ok(*i as f64),
            Some(a) => self.bad(name, "a number", a),
        }
    }

    pub(super) fn opt_float(&mut self, name: &str) -> CallResult<Option<f64>> {
        match self.take(name) {
            None | Some(Attr::None) => Ok(None),
            Some(Attr::Float(x)) => Ok(Some(*x)),
            Some(Attr::Int(i)) => Ok(Some(*i as f64)),
            Some(a) => self.bad(name, "a number or none", a),
        }
    }

    pub(super) fn bool(&mut self, name: &str, default: bool) -> CallResult<bool> {
        match self.take(name) {
            None => Ok(default),
            Some(Attr::Bool(b)) => Ok(*b),
            Some(a) => self.bad(name, "true or false", a),
        }
    }

    pub(super) fn string(&mut self, name: &str, default: Option<&str>) -> CallResult<String> {
        match (self.take(name), default) {
            (Some(Attr::Str(s)), _) => Ok(s.clone()),
            (Some(a), _) => self.bad(name, "a string", a),
            (None, Some(d)) => Ok(d.to_string()),
            (None, None) => self.missing(name),
        }
    }

    pub(super) fn opt_dtype(&mut self, name: &str) -> CallResult<Option<DType>> {
        match self.take(name) {
            None | Some(Attr::None) => Ok(None),
            Some(Attr::DType(d)) => Ok(Some(*d)),
            Some(a) => self.bad(name, "a dtype", a),
        }
    }

    pub(super) fn dtype(&mut self, name: &str) -> CallResult<DType> {
        match self.opt_dtype(name)? {
            Some(d) => Ok(d),
            None => self.missing(name),
        }
    }

    pub(super) fn int_list_of(&self, name: &str, a: &Attr) -> CallResult<Vec<i64>> {
        match a {
            Attr::List(xs) => xs
                .iter()
                .map(|x| {
                    self.int_of(name, x)
                        .or_else(|_| self.bad(name, "a list of ints", a))
                })
                .collect(),
            _ => self.bad(name, "a list of ints", a),
        }
    }

    pub(super) fn int_list(&mut self, name: &str) -> CallResult<Vec<i64>> {
        match self.take(name) {
            Some(a) => self.int_list_of(name, a),
            None => self.missing(name),
        }
    }

    /// An int or a list of ints (`stride=2`, `stride=[2, 1]`), broadcast to `n` entries as
    /// PyTorch's `_pair`; `default` when left out (or `none`).
    pub(super) fn int_or_list(
        &mut self,
        name: &str,
        n: usize,
        default: &[i64],
    ) -> CallResult<Vec<i64>> {
        let xs = match self.take(name) {
            None | Some(Attr::None) => return Ok(default.to_vec()),
            Some(Attr::List(l)) if l.is_empty() => return Ok(default.to_vec()),
            Some(a @ Attr::List(_)) => self.int_list_of(name, a)?,
            Some(a) => vec![self.int_of(name, a)?],
        };
        crate::ir::conv::spatial_list(name, &xs, n).or_else(|e| err(Some(name), e.to_string()))
    }

    /// A convolution's `padding`: an int, a list, `"same"` or `"valid"`.
    pub(super) fn conv_padding(&mut self, n: usize) -> CallResult<ConvPadding> {
        match self.take("padding") {
            Some(Attr::Str(s)) => match s.as_str() {
                "same" => Ok(ConvPadding::Same),
                "valid" => Ok(ConvPadding::Valid),
                _ => err(Some("padding"), format!("Invalid padding string: '{s}'")),
            },
            Some(a) => {
                let xs = match a {
                    Attr::List(_) => self.int_list_of("padding", a)?,
                    other => vec![self.int_of("padding", other)?],
                };
                crate::ir::conv::spatial_list("padding", &xs, n)
                    .map(ConvPadding::Explicit)
                    .or_else(|e| err(Some("padding"), e.to_string()))
            }
            None => Ok(ConvPadding::Explicit(vec![0; n])),
        }
    }

    pub(super) fn conv_attrs(&mut self, n: usize) -> CallResult<ConvAttrs> {
        Ok(ConvAttrs {
            stride: self.int_or_list("stride", n, &vec![1; n])?,
            padding: self.conv_padding(n)?,
            dilation: self.int_or_list("dilation", n, &vec![1; n])?,
            groups: self.int("groups", Some(1))?,
        })
    }

    pub(super) fn pool_attrs(&mut self, dilation: bool) -> CallResult<PoolAttrs> {
        let kernel_size = self.int_or_list("kernel_size", 2, &[])?;
        if kernel_size.is_empty() {
            return self.missing("kernel_size");
        }
        Ok(PoolAttrs {
            stride: self.int_or_list("stride", 2, &kernel_size)?,
            padding: self.int_or_list("padding", 2, &[0, 0])?,
            dilation: if dilation {
                self.int_or_list("dilation", 2, &[1, 1])?
            } else {
                vec![1, 1]
            },
            ceil_mode: self.bool("ceil_mode", false)?,
            kernel_size,
        })
    }

    pub(super) fn size_list(&mut self, name: &str) -> CallResult<Vec<usize>> {
        let a = self.take(name);
        let xs = match a {
            Some(a) => self.int_list_of(name, a)?,
            None => return self.missing(name),
        };
        xs.iter()
            .map(|&x| {
                usize::try_from(x).or_else(|_| {
                    err(
                        Some(name),
                        format!(
                            "attribute '{name}' of '{}' must not be negative, got {x}",
                            self.op
                        ),
                    )
                })
            })
            .collect()
    }

    /// An int or a list of ints; `none` or absent is `None`.
    pub(super) fn dims(&mut self, name: &str) -> CallResult<Option<Vec<i64>>> {
        match self.take(name) {
            None | Some(Attr::None) => Ok(None),
            Some(Attr::Int(i)) => Ok(Some(vec![*i])),
            Some(a @ Attr::List(_)) => self.int_list_of(name, a).map(Some),
            Some(a) => self.bad(name, "an int or a list of ints", a),
        }
    }

    pub(super) fn opt_scalar(&mut self, name: &str) -> CallResult<Option<Scalar>> {
        match self.take(name) {
            None | Some(Attr::None) => Ok(None),
            Some(Attr::Int(i)) => Ok(Some(Scalar::Int(*i))),
            Some(Attr::Float(x)) => Ok(Some(Scalar::Float(*x))),
            Some(Attr::Bool(b)) => Ok(Some(Scalar::Bool(*b))),
            Some(a) => self.bad(name, "a number", a),
        }
    }

    pub(super) fn scalar(&mut self, name: &str, default: Option<Scalar>) -> CallResult<Scalar> {
        match (self.opt_scalar(name)?, default) {
            (Some(s), _) | (None, Some(s)) => Ok(s),
            (None, None) => self.missing(name),
        }
    }

    /// Fails on any attribute the constructor did not read.
    pub(super) fn finish(self) -> CallResult<()> {
        match self.attrs.first() {
            Some((n, _)) => err(
                Some(n),
                format!("unknown attribute '{n}' for op '{}'", self.op),
            ),
            None => Ok(()),
        }
    }
}
