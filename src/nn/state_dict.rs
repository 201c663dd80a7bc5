//! State dicts: a module's named tensors, saved to and loaded from safetensors files.
//!
//! The file format is the `safetensors` crate's: an 8-byte header length, a JSON header of
//! names, dtypes, shapes and offsets, then the little-endian data. Malformed or truncated
//! files are errors, never panics.

use crate::nn::Module;
use crate::nn::functional::torch_size;
use crate::runtime::Tensor;
use crate::{DType, Error, Result, bail};
use safetensors::tensor::{Dtype as StDtype, SafeTensors, TensorView};
use std::collections::{BTreeMap, HashSet};
use std::path::Path;

fn to_st_dtype(d: DType) -> StDtype {
    match d {
        DType::Bool => StDtype::BOOL,
        DType::U8 => StDtype::U8,
        DType::I8 => StDtype::I8,
        DType::I16 => StDtype::I16,
        DType::I32 => StDtype::I32,
        DType::I64 => StDtype::I64,
        DType::F16 => StDtype::F16,
        DType::BF16 => StDtype::BF16,
        DType::F32 => StDtype::F32,
        DType::F64 => StDtype::F64,
    }
}

fn from_st_dtype(d: StDtype, name: &str) -> Result<DType> {
    Ok(match d {
        StDtype::BOOL => DType::Bool,
        StDtype::U8 => DType::U8,
        StDtype::I8 => DType::I8,
        StDtype::I16 => DType::I16,
        StDtype::I32 => DType::I32,
        StDtype::I64 => DType::I64,
        StDtype::F16 => DType::F16,
        StDtype::BF16 => DType::BF16,
        StDtype::F32 => DType::F32,
        StDtype::F64 => DType::F64,
        other => bail!(
            DType,
            "safetensors: tensor \"{name}\" has dtype {other:?}, which smelt does not support"
        ),
    })
}

/// Encodes named tensors as the bytes of a safetensors file.
pub fn to_safetensors_bytes(tensors: &[(String, Tensor)]) -> Result<Vec<u8>> {
    let mut seen = HashSet::new();
    let mut data = Vec::with_capacity(tensors.len());
    for (name, t) in tensors {
        if !seen.insert(name.as_str()) {
            bail!(Value, "safetensors: the name \"{name}\" appears twice");
        }
        data.push((name.clone(), t.dtype(), t.shape().to_vec(), t.to_bytes()?));
    }
    let views = data
        .iter()
        .map(|(name, dtype, shape, bytes)| {
            TensorView::new(to_st_dtype(*dtype), shape.clone(), bytes)
                .map(|v| (name.as_str(), v))
                .map_err(|e| Error::Value(format!("safetensors: tensor \"{name}\": {e}")))
        })
        .collect::<Result<Vec<_>>>()?;
    safetensors::serialize(views, None).map_err(|e| Error::Value(format!("safetensors: {e}")))
}

/// Decodes the bytes of a safetensors file into named tensors, sorted by name.
pub fn from_safetensors_bytes(bytes: &[u8]) -> Result<Vec<(String, Tensor)>> {
    let st = SafeTensors::deserialize(bytes)
        .map_err(|e| Error::Value(format!("malformed safetensors data: {e}")))?;
    let mut out = Vec::with_capacity(st.len());
    for (name, view) in st.iter() {
        let dtype = from_st_dtype(view.dtype(), name)?;
        let t = Tensor::from_bytes(dtype, view.shape(), view.data())
            .map_err(|e| Error::Value(format!("safetensors: tensor \"{name}\": {e}")))?;
        out.push((name.to_string(), t));
    }
    out.sort_by(|a, b| a.0.cmp(&b.0));
    Ok(out)
}

/// Writes named tensors to a safetensors file.
pub fn save_safetensors(path: impl AsRef<Path>, tensors: &[(String, Tensor)]) -> Result<()> {
    let path = path.as_ref();
    let bytes = to_safetensors_bytes(tensors)?;
    crate::device::cache::write_atomic(path, &bytes)
}

/// Reads the named tensors of a safetensors file.
pub fn load_safetensors(path: impl AsRef<Path>) -> Result<Vec<(String, Tensor)>> {
    let path = path.as_ref();
    let bytes = std::fs::read(path).map_err(|e| Error::Io(format!("{}: {e}", path.display())))?;
    from_safetensors_bytes(&bytes).map_err(|e| match e {
        Error::Value(m) => Error::Value(format!("{}: {m}", path.display())),
        other => other,
    })
}

/// A module's state: its parameters, then its buffers (running statistics), by name. The
/// tensors share storage with the module's.
pub fn state_dict<M: Module + ?Sized>(module: &M) -> Vec<(String, Tensor)> {
    let mut state = module.named_parameters();
    state.extend(module.named_buffers());
    state
}

/// Copies `state` into the module's parameters (`load_state_dict`). Every key is checked
/// before anything is copied, so a failed load leaves the module unchanged. With `strict`,
/// missing and unexpected keys are errors; shapes and dtypes must always match.
pub fn load_state_dict<M: Module + ?Sized>(
    module: &M,
    state: &[(String, Tensor)],
    strict: bool,
) -> Result<()> {
    let params = state_dict(module);
    let given: BTreeMap<&str, &Tensor> = state.iter().map(|(k, t)| (k.as_str(), t)).collect();
    let own: HashSet<&str> = params.iter().map(|(k, _)| k.as_str()).collect();
    let mut errors = Vec::new();
    if strict {
        let unexpected: Vec<String> = given
            .keys()
            .filter(|k| !own.contains(*k))
            .map(|k| format!("\"{k}\""))
            .collect();
        let missing: Vec<String> = params
            .iter()
            .filter(|(k, _)| !given.contains_key(k.as_str()))
            .map(|(k, _)| format!("\"{k}\""))
            .collect();
        if !missing.is_empty() {
            errors.push(format!(
                "Missing key(s) in state_dict: {}.",
                missing.join(", ")
            ));
        }
        if !unexpected.is_empty() {
            errors.push(format!(
                "Unexpected key(s) in state_dict: {}.",
                unexpected.join(", ")
            ));
        }
    }
    for (name, p) in &params {
        let Some(src) = given.get(name.as_str()) else {
            continue;
        };
        if src.shape() != p.shape() {
            errors.push(format!(
                "size mismatch for {name}: copying a param with shape {} from checkpoint, the shape in current model is {}.",
                torch_size(src.shape()),
                torch_size(p.shape())
            ));
        } else if src.dtype() != p.dtype() {
            errors.push(format!(
                "dtype mismatch for {name}: copying a param of dtype {} from checkpoint, the dtype in current model is {}.",
                src.dtype().torch_name(),
                p.dtype().torch_name()
            ));
        }
    }
    if !errors.is_empty() {
        bail!(
            Value,
            "Error(s) in loading state_dict:\n\t{}",
            errors.join("\n\t")
        );
    }
    let _g = crate::autograd::no_grad();
    for (name, p) in &params {
        if let Some(src) = given.get(name.as_str()) {
            p.copy_(src)?;
        }
    }
    Ok(())
}

/// Saves a module's state dict to a safetensors file.
pub fn save<M: Module + ?Sized>(module: &M, path: impl AsRef<Path>) -> Result<()> {
    save_safetensors(path, &state_dict(module))
}

/// Loads a module's parameters from a safetensors file (strict).
pub fn load<M: Module + ?Sized>(module: &M, path: impl AsRef<Path>) -> Result<()> {
    load_state_dict(module, &load_safetensors(path)?, true)
}
