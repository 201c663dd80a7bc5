//! The readers' entry points, one per fuzz target (see the module above).

use crate::ir::sym::Bindings;
use crate::ir::text::{SymbolicModule, parse_module, print_module};
use crate::nn::state_dict::{from_safetensors_bytes, to_safetensors_bytes};
use crate::runtime::npy::{npy_to_bytes, read_npy_bytes};

/// A reader's entry point.
pub type Target = fn(&[u8]);

/// The readers, by the name of their fuzz target and corpus folder.
pub const TARGETS: [(&str, Target); 6] = [
    ("smelt_text", smelt_text),
    ("npy", npy),
    ("safetensors", safetensors),
    ("onnx", onnx),
    ("cache_entry", cache_entry),
    ("aot_entry", aot_entry),
];

/// A `.smelt` file: lexed, parsed and verified, fixed-size and symbolic. A module that
/// parses prints to text that parses again and prints the same.
pub fn smelt_text(data: &[u8]) {
    let Ok(text) = std::str::from_utf8(data) else {
        return;
    };
    if let Ok(m) = parse_module(text, "fuzz.smelt") {
        let printed = print_module(&m);
        let again = parse_module(&printed, "printed.smelt")
            .unwrap_or_else(|e| panic!("printed module does not parse: {e}\n{printed}"));
        assert_eq!(print_module(&again), printed, "printing is not stable");
    }
    if let Ok(s) = SymbolicModule::parse(text, "fuzz.smelt") {
        // every symbol at 1, then at 2: the graph instantiates or fails cleanly
        for size in [1i64, 2] {
            let env: Bindings = s.symbols().iter().map(|n| (n.clone(), size)).collect();
            let _ = s.instantiate(&env);
        }
    }
}

/// A `.npy` file. What reads, written and read back, gives the same bytes.
pub fn npy(data: &[u8]) {
    let Ok(t) = read_npy_bytes(data, "fuzz.npy") else {
        return;
    };
    let Ok(bytes) = npy_to_bytes(&t) else {
        return;
    };
    let back = read_npy_bytes(&bytes, "written.npy")
        .unwrap_or_else(|e| panic!("a written .npy does not read back: {e}"));
    assert_eq!(back.shape(), t.shape());
    assert_eq!(npy_to_bytes(&back).ok(), Some(bytes), "npy round trip");
}

/// A `.safetensors` file. What reads, written and read back, gives the same tensors.
pub fn safetensors(data: &[u8]) {
    let Ok(ts) = from_safetensors_bytes(data) else {
        return;
    };
    let bytes = to_safetensors_bytes(&ts)
        .unwrap_or_else(|e| panic!("tensors read from safetensors do not write: {e}"));
    let back = from_safetensors_bytes(&bytes)
        .unwrap_or_else(|e| panic!("written safetensors do not read back: {e}"));
    assert_eq!(back.len(), ts.len());
    for ((n1, t1), (n2, t2)) in ts.iter().zip(&back) {
        assert_eq!(n1, n2);
        assert_eq!(t1.dtype(), t2.dtype());
        assert_eq!(t1.shape(), t2.shape());
        assert_eq!(t1.to_bytes().ok(), t2.to_bytes().ok(), "tensor {n1}");
    }
}

/// An `.onnx` model: decoded (external data refused), its inputs listed and its graph
/// imported at the declared sizes (named dims at 1).
pub fn onnx(data: &[u8]) {
    let Ok(m) = crate::onnx::from_bytes(data, None) else {
        return;
    };
    let _ = m.output_elem_types();
    if m.inputs().is_ok()
        && let Ok(imp) = m.import(&[])
    {
        imp.graph
            .verify()
            .unwrap_or_else(|e| panic!("an imported graph does not verify: {e}"));
    }
}

/// The C entry point of ahead-of-time models, called with the faults and inputs `data`
/// gives (see `src/fuzz/aot_entry.rs`).
pub fn aot_entry(data: &[u8]) {
    super::aot_entry::aot_entry(data);
}

/// An entry of the CPU disk cache: `data` is the payload, framed as an entry is (so that the
/// checksum holds), decoded, its schedule validated and its object linked, never run.
pub fn cache_entry(data: &[u8]) {
    crate::exec::cpu::fuzz_cache_entry(data);
}
