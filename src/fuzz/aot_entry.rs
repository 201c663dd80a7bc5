//! The `aot_entry` fuzz target: the C entry point of ahead-of-time models (`NAME_run`)
//! called as a careless or hostile C caller might, with the arguments and the input bytes
//! the fuzzer chooses.
//!
//! The first byte picks a model and the faults of the call: the inputs or outputs array
//! NULL, one of their pointers NULL, the scratch NULL (the run-time library allocates it),
//! too short or misaligned. The second byte says which pointer and how far off the scratch
//! is; the rest fills the inputs, so indices run out of range and divisors are 0. Every
//! call must return 0 or a documented code, and a faulty argument must get its own code
//! before the model runs.

use crate::aot::{AotOptions, LoadedModel, compile};
use crate::ir::text::parse_module;
use smelt_rt::model::{
    ERR_INDEX_OUT_OF_RANGE, ERR_NULL_POINTER, ERR_SCRATCH_MISALIGNED, ERR_SCRATCH_TOO_SMALL,
    ERR_ZERO_DIVISION, ERRORS, OK, SCRATCH_ALIGN,
};
use std::sync::OnceLock;

/// The models the target calls: indices (embedding, gather, index_select), an integer
/// division and remainder, and float math with a reduction and a product.
const MODELS: &str = "\
graph lookup(%ids: i64[2,3], %w: f32[10,4], %k: i64[6,2], %j: i64[3]) {
  %e = embedding(%ids, %w)
  %f = reshape(%e, shape=[6,4])
  %g = gather(%f, %k, dim=1)
  %s = index_select(%w, %j, dim=0)
  return %g, %s
}
graph divide(%a: i32[7], %b: i32[7]) {
  %q = div(%a, %b, rounding_mode=\"floor\")
  %r = remainder(%a, %b)
  return %q, %r
}
graph math(%x: f32[4,9], %w: f32[9,5]) {
  %t = tanh(%x)
  %p = matmul(%t, %w)
  %s = softmax(%p, dim=1)
  %m = sum(%s, dim=[0])
  return %s, %m
}
";

/// The compiled models, loaded once per process.
fn models() -> &'static [LoadedModel] {
    static MODELS_LOADED: OnceLock<Vec<LoadedModel>> = OnceLock::new();
    MODELS_LOADED.get_or_init(|| {
        let m = parse_module(MODELS, "aot_entry.smelt").expect("the target's models parse");
        m.graphs
            .iter()
            .map(|g| {
                compile(g, &AotOptions::default())
                    .and_then(|m| m.load())
                    .unwrap_or_else(|e| panic!("the target's model {} compiles: {e}", g.name))
            })
            .collect()
    })
}

/// Faults of a call, bits of the first byte (above the model's two bits).
const NULL_INPUTS: u8 = 1 << 2;
const NULL_OUTPUTS: u8 = 1 << 3;
const NULL_ENTRY: u8 = 1 << 4;
const NULL_SCRATCH: u8 = 1 << 5;
const SHORT_SCRATCH: u8 = 1 << 6;
const MISALIGNED_SCRATCH: u8 = 1 << 7;

/// Calls a model as `data` says (see the module).
pub fn aot_entry(data: &[u8]) {
    call(data);
}

/// [`aot_entry`]'s call, checked; its code (None for data too short to say a call).
fn call(data: &[u8]) -> Option<i32> {
    let [how, which, rest @ ..] = data else {
        return None;
    };
    let models = models();
    let m = &models[(how & 3) as usize % models.len()];
    // inputs in 64-byte aligned words, filled from the rest of the data in turn
    let mut fill = rest.iter().copied().cycle();
    let mut inputs: Vec<Vec<u64>> = m
        .inputs()
        .iter()
        .map(|p| {
            let mut w = vec![0u64; p.bytes().div_ceil(8).max(1)];
            // SAFETY: `w` holds at least `p.bytes()` bytes
            let bytes =
                unsafe { std::slice::from_raw_parts_mut(w.as_mut_ptr() as *mut u8, p.bytes()) };
            if !rest.is_empty() {
                bytes.iter_mut().for_each(|b| *b = fill.next().unwrap_or(0));
            }
            w
        })
        .collect();
    let mut outputs: Vec<Vec<u64>> = m
        .outputs()
        .iter()
        .map(|p| vec![0u64; p.bytes().div_ceil(8).max(1)])
        .collect();
    let mut in_ptrs: Vec<*const u8> = inputs.iter_mut().map(|w| w.as_ptr() as *const u8).collect();
    let mut out_ptrs: Vec<*mut u8> = outputs
        .iter_mut()
        .map(|w| w.as_mut_ptr() as *mut u8)
        .collect();
    let null_entry = how & NULL_ENTRY != 0;
    if null_entry {
        // an input's pointer when `which` is even, an output's when odd
        let i = (*which >> 1) as usize;
        if which & 1 == 0 {
            let n = in_ptrs.len();
            in_ptrs[i % n] = std::ptr::null();
        } else {
            let n = out_ptrs.len();
            out_ptrs[i % n] = std::ptr::null_mut();
        }
    }
    let need = m.scratch_bytes();
    // room for a 64-byte aligned start and 63 bytes more; a short scratch lacks 1 to 64
    let mut scratch = vec![0u64; (need + 192).div_ceil(8)];
    let base = scratch.as_mut_ptr() as *mut u8;
    let base = base.wrapping_add(base.align_offset(64));
    let short = how & SHORT_SCRATCH != 0 && need > 0;
    let len = if short {
        need.saturating_sub(1 + (*which as usize % 64))
    } else {
        need
    };
    let offset = if how & MISALIGNED_SCRATCH != 0 {
        1 + (*which as usize % 63)
    } else {
        0
    };
    let scratch_ptr = if how & NULL_SCRATCH != 0 {
        std::ptr::null_mut()
    } else {
        base.wrapping_add(offset)
    };
    let inputs_arg = match how & NULL_INPUTS {
        0 => in_ptrs.as_ptr(),
        _ => std::ptr::null(),
    };
    let outputs_arg = match how & NULL_OUTPUTS {
        0 => out_ptrs.as_ptr(),
        _ => std::ptr::null(),
    };
    // SAFETY: each non-NULL pointer is to its port's bytes (zeroed outputs, writable); the
    // scratch pointer, where not NULL, has `len` writable bytes after it (`offset + len` is
    // within the buffer).
    let code = unsafe { m.call_raw(inputs_arg, outputs_arg, scratch_ptr, len) };
    assert!(
        code == OK || ERRORS.iter().any(|e| e.0 == code),
        "an undocumented code {code}"
    );
    // the first fault the run-time library checks decides the code
    let expected = if how & (NULL_INPUTS | NULL_OUTPUTS) != 0 {
        Some(ERR_NULL_POINTER)
    } else if how & NULL_SCRATCH != 0 {
        None
    } else if short {
        Some(ERR_SCRATCH_TOO_SMALL)
    } else if offset % SCRATCH_ALIGN != 0 {
        // (an offset of a multiple of the alignment is a good scratch)
        Some(ERR_SCRATCH_MISALIGNED)
    } else {
        None
    };
    // what the inputs' values may make of a call with good arguments
    let ran = [OK, ERR_INDEX_OUT_OF_RANGE, ERR_ZERO_DIVISION];
    match expected {
        Some(e) => assert_eq!(code, e, "the call's fault {how:#x} gave {code}"),
        // an input's pointer is checked before the model runs
        None if null_entry && which & 1 == 0 => {
            assert_eq!(code, ERR_NULL_POINTER, "a NULL input gave {code}")
        }
        // an output's when its result is copied out, after the steps (which may fail first)
        None if null_entry => assert!(
            code == ERR_NULL_POINTER || (code != OK && ran.contains(&code)),
            "a NULL output gave {code}"
        ),
        None => assert!(ran.contains(&code), "good arguments gave {code}"),
    }
    Some(code)
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The codes of calls whose outcome is known: each fault, and inputs that run, index
    /// out of range and divide by zero.
    #[test]
    fn each_fault_and_each_failing_input_gets_its_code() {
        let (lookup, divide, math) = (0u8, 1u8, 2u8);
        let ones = [1u8; 8];
        let cases: [(&[u8], i32); 10] = [
            // indices 0, then all bytes 1 (index 0x0101..., out of range)
            (&[lookup, 0], OK),
            (&[&[lookup, 0][..], &ones].concat(), ERR_INDEX_OUT_OF_RANGE),
            // divisors 0, then 0x01010101
            (&[divide, 0], ERR_ZERO_DIVISION),
            (&[&[divide, 0][..], &ones].concat(), OK),
            (&[math | NULL_INPUTS, 0], ERR_NULL_POINTER),
            (&[math | NULL_ENTRY, 2], ERR_NULL_POINTER),
            (&[math | SHORT_SCRATCH, 0], ERR_SCRATCH_TOO_SMALL),
            (&[math | MISALIGNED_SCRATCH, 4], ERR_SCRATCH_MISALIGNED),
            // 1 + 94 % 63 = 32 bytes off: still aligned to SCRATCH_ALIGN (16)
            (&[math | MISALIGNED_SCRATCH, 94], OK),
            (&[math | NULL_SCRATCH, 0], OK),
        ];
        for (data, want) in cases {
            assert_eq!(call(data), Some(want), "{data:?}");
        }
        assert_eq!(call(&[math]), None);
    }
}
