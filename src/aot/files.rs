//! The files of a compiled model: the C header, the Rust bindings, the manifest, the static
//! library for `build.rs`, and where the run-time library is.

use super::{AotModel, Port};
use crate::kernel::Schedule;
use crate::{Error, Result, bail};
use serde_json::{Value, json};
use std::fmt::Write as _;
use std::path::{Path, PathBuf};

pub(super) fn write(path: &Path, bytes: &[u8]) -> Result<()> {
    crate::device::cache::write_atomic(path, bytes)
}

pub(super) fn create_dir(dir: &Path) -> Result<()> {
    std::fs::create_dir_all(dir).map_err(|e| Error::Io(format!("{}: {e}", dir.display())))
}

/// `name` in upper case with every other character than letters and digits as `_`.
fn macro_name(name: &str) -> String {
    name.chars()
        .map(|c| {
            if c.is_ascii_alphanumeric() {
                c.to_ascii_uppercase()
            } else {
                '_'
            }
        })
        .collect()
}

fn dims(shape: &[usize]) -> String {
    let d: Vec<String> = shape.iter().map(usize::to_string).collect();
    d.join(", ")
}

fn port_type(p: &Port) -> String {
    format!("{}[{}]", p.dtype, dims(&p.shape).replace(' ', ""))
}

/// The C header of `m`.
pub(super) fn header(m: &AotModel) -> String {
    let (n, up) = (&m.name, macro_name(&m.name));
    let mut h = String::new();
    let _ = writeln!(
        h,
        "/* {n}.h: the model {n} (graph {}), compiled ahead of time by smelt {} for the CPU ({}, {}).\n * Link: cc main.c {n}.o $(cat link-flags.txt)\n * Every array is C-contiguous (row-major), of the dtype and shape stated here. */",
        m.graph,
        env!("CARGO_PKG_VERSION"),
        m.cpu.name(),
        m.cpu.triple()
    );
    let _ = writeln!(
        h,
        "#ifndef SMELT_MODEL_{up}_H\n#define SMELT_MODEL_{up}_H\n"
    );
    h.push_str("#include <stddef.h>\n\n#ifdef __cplusplus\nextern \"C\" {\n#endif\n\n");
    let _ = writeln!(h, "#define {up}_NUM_INPUTS {}", m.inputs.len());
    let _ = writeln!(h, "#define {up}_NUM_OUTPUTS {}", m.outputs.len());
    let _ = writeln!(
        h,
        "/* Bytes of scratch a call needs, and the alignment of a scratch buffer (malloc's). */"
    );
    let _ = writeln!(h, "#define {up}_SCRATCH_BYTES {}", m.scratch_bytes);
    let _ = writeln!(
        h,
        "#define {up}_SCRATCH_ALIGN {}\n",
        smelt_rt::model::SCRATCH_ALIGN
    );
    let _ = writeln!(
        h,
        "/* The results of {n}_run; {n}_error_string(code) describes each. */"
    );
    for &(code, name, msg) in smelt_rt::model::ERRORS {
        let _ = writeln!(h, "#define {up}_{name} {code} /* {msg} */");
    }
    for (kind, ports) in [("INPUT", &m.inputs), ("OUTPUT", &m.outputs)] {
        let _ = writeln!(
            h,
            "\n/* {}s, in {} order. */",
            kind.to_lowercase(),
            if kind == "INPUT" {
                "parameter"
            } else {
                "return"
            }
        );
        for (i, p) in ports.iter().enumerate() {
            let pm = format!("{up}_{kind}_{}", macro_name(&p.name));
            let _ = writeln!(h, "#define {pm} {i} /* {}: {} */", p.name, port_type(p));
            let _ = writeln!(h, "#define {pm}_DTYPE \"{}\"", p.dtype);
            let _ = writeln!(h, "#define {pm}_RANK {}", p.shape.len());
            let _ = writeln!(h, "#define {pm}_SHAPE {{{}}}", dims(&p.shape));
            let _ = writeln!(
                h,
                "#define {pm}_NUMEL {}",
                p.shape.iter().product::<usize>()
            );
        }
        let names: Vec<String> = ports.iter().map(|p| format!("\"{}\"", p.name)).collect();
        let _ = writeln!(h, "#define {up}_{kind}_NAMES {{{}}}", names.join(", "));
    }
    // C has no empty arrays: a model without inputs declares one (zero) entry
    let len = |n: usize, m: &str| if n > 0 { m.to_string() } else { "1".into() };
    let _ = writeln!(
        h,
        "\n/* Bytes of each input and output array. */\nextern const size_t {n}_input_bytes[{}];\nextern const size_t {n}_output_bytes[{}];\n",
        len(m.inputs.len(), &format!("{up}_NUM_INPUTS")),
        len(m.outputs.len(), &format!("{up}_NUM_OUTPUTS"))
    );
    let _ = writeln!(
        h,
        "/* Runs the model: inputs[i] points to input i, outputs[i] to caller-allocated memory for\n * output i. scratch: NULL (the call allocates) or {up}_SCRATCH_BYTES bytes aligned to\n * {up}_SCRATCH_ALIGN (then the call does not allocate). Safe to call from several threads\n * at once, each with its own scratch. A training dropout draws a new mask each call (the\n * calls are counted from 0 in each process). Returns {up}_OK or an error code. */"
    );
    let _ = writeln!(
        h,
        "int {n}_run(const void *const *inputs, void *const *outputs, void *scratch, size_t scratch_bytes);\n"
    );
    let _ = writeln!(
        h,
        "/* A static, NUL-terminated description of a result of {n}_run. */\nconst char *{n}_error_string(int code);\n"
    );
    h.push_str("#ifdef __cplusplus\n}\n#endif\n\n");
    let _ = writeln!(h, "#endif /* SMELT_MODEL_{up}_H */");
    h
}

/// The Rust element type of a dtype.
fn rust_type(d: crate::DType) -> &'static str {
    use crate::DType::*;
    match d {
        Bool => "bool",
        U8 => "u8",
        I8 => "i8",
        I16 => "i16",
        I32 => "i32",
        I64 => "i64",
        F16 => "smelt_rt::half::f16",
        BF16 => "smelt_rt::half::bf16",
        F32 => "f32",
        F64 => "f64",
    }
}

/// `name` as a Rust parameter name.
fn rust_ident(name: &str) -> String {
    let mut s: String = name
        .chars()
        .map(|c| {
            if c.is_ascii_alphanumeric() {
                c.to_ascii_lowercase()
            } else {
                '_'
            }
        })
        .collect();
    if s.is_empty() || s.starts_with(|c: char| c.is_ascii_digit()) {
        s.insert(0, '_');
    }
    const KEYWORDS: [&str; 12] = [
        "as", "fn", "if", "in", "let", "loop", "match", "mod", "ref", "type", "use", "where",
    ];
    if KEYWORDS.contains(&s.as_str()) {
        s.push('_');
    }
    s
}

/// The Rust bindings of `m`: the C entry point and a typed function over it.
pub(super) fn rust_module(m: &AotModel) -> String {
    let (n, up) = (&m.name, macro_name(&m.name));
    let numel = |p: &Port| p.shape.iter().product::<usize>();
    let mut r = String::new();
    let _ = writeln!(
        r,
        "// The model `{n}` (graph {}), compiled ahead of time by smelt {} for the CPU ({}).\n// Generated: include it with `include!(concat!(env!(\"OUT_DIR\"), \"/{n}.rs\"));`.\n",
        m.graph,
        env!("CARGO_PKG_VERSION"),
        m.cpu.name()
    );
    let _ = writeln!(
        r,
        "unsafe extern \"C\" {{\n    fn {n}_run(\n        inputs: *const *const u8,\n        outputs: *const *mut u8,\n        scratch: *mut u8,\n        scratch_bytes: usize,\n    ) -> i32;\n}}\n"
    );
    let _ = writeln!(
        r,
        "// The object calls the run-time library's helpers by name: this keeps them linked.\n#[used]\nstatic {up}_HELPERS: fn() -> Vec<(&'static str, *const u8, smelt_rt::Sig)> = smelt_rt::helpers;\n"
    );
    let _ = writeln!(
        r,
        "/// Bytes of scratch a call of [`{n}_with_scratch`] needs.\n#[allow(dead_code)]\npub const {up}_SCRATCH_BYTES: usize = {};\n",
        m.scratch_bytes
    );
    let params: Vec<String> = m
        .inputs
        .iter()
        .map(|p| {
            format!(
                "{}: &[{}; {}]",
                rust_ident(&p.name),
                rust_type(p.dtype),
                numel(p)
            )
        })
        .collect();
    let outs: Vec<String> = m
        .outputs
        .iter()
        .map(|p| format!("Box<[{}; {}]>", rust_type(p.dtype), numel(p)))
        .collect();
    let ret = if outs.len() == 1 {
        outs[0].clone()
    } else {
        format!(
            "({})",
            outs.iter().map(|o| format!("{o},")).collect::<String>()
        )
    };
    let docs: Vec<String> = m
        .inputs
        .iter()
        .map(|p| format!("`{}`: {}", p.name, port_type(p)))
        .collect();
    let out_docs: Vec<String> = m
        .outputs
        .iter()
        .map(|p| format!("`{}`: {}", p.name, port_type(p)))
        .collect();
    for scratch in [false, true] {
        let fname = if scratch {
            format!("{n}_with_scratch")
        } else {
            n.clone()
        };
        let _ = writeln!(
            r,
            "/// Runs `{n}` on {} (row-major); returns {}.{}\n#[allow(dead_code, clippy::too_many_arguments)]\npub fn {fname}({}{}) -> Result<{ret}, smelt_rt::model::AotError> {{",
            if docs.is_empty() {
                "no inputs".to_string()
            } else {
                docs.join(", ")
            },
            out_docs.join(", "),
            if scratch {
                format!(
                    " `scratch` must hold at least [`{up}_SCRATCH_BYTES`] bytes: the call then does not allocate."
                )
            } else {
                String::new()
            },
            params.join(", "),
            if scratch {
                format!(
                    "{}scratch: &mut [u128]",
                    if params.is_empty() { "" } else { ", " }
                )
            } else {
                String::new()
            }
        );
        for (i, p) in m.outputs.iter().enumerate() {
            let _ = writeln!(
                r,
                "    let mut out{i}: Box<[{t}; {k}]> = vec![<{t}>::default(); {k}].into_boxed_slice().try_into().map_err(|_| smelt_rt::model::AotError {{ code: smelt_rt::model::ERR_OUT_OF_MEMORY }})?;",
                t = rust_type(p.dtype),
                k = numel(p)
            );
        }
        let ins: Vec<String> = m
            .inputs
            .iter()
            .map(|p| format!("{}.as_ptr() as *const u8", rust_ident(&p.name)))
            .collect();
        let os: Vec<String> = (0..m.outputs.len())
            .map(|i| format!("out{i}.as_mut_ptr() as *mut u8"))
            .collect();
        let _ = writeln!(
            r,
            "    let inputs: [*const u8; {}] = [{}];\n    let outputs: [*mut u8; {}] = [{}];",
            ins.len(),
            ins.join(", "),
            os.len(),
            os.join(", ")
        );
        let (sp, sl) = if scratch {
            (
                "scratch.as_mut_ptr() as *mut u8",
                "std::mem::size_of_val(scratch)",
            )
        } else {
            ("std::ptr::null_mut()", "0")
        };
        let _ = writeln!(
            r,
            "    // SAFETY: one pointer per input and output, each to an array of its size; the\n    // scratch is NULL or holds the bytes it says, 16-byte aligned.\n    let code = unsafe {{ {n}_run(inputs.as_ptr(), outputs.as_ptr(), {sp}, {sl}) }};\n    if code != 0 {{\n        return Err(smelt_rt::model::AotError {{ code }});\n    }}"
        );
        let vals: Vec<String> = (0..m.outputs.len()).map(|i| format!("out{i}")).collect();
        let _ = writeln!(
            r,
            "    Ok({})\n}}\n",
            if vals.len() == 1 {
                vals[0].clone()
            } else {
                format!(
                    "({})",
                    vals.iter().map(|v| format!("{v},")).collect::<String>()
                )
            }
        );
    }
    r
}

fn ports_json(ports: &[Port]) -> Value {
    let ports: Vec<Value> = ports
        .iter()
        .map(|p| {
            json!({
                "name": p.name,
                "dtype": p.dtype.to_string(),
                "shape": p.shape,
                "bytes": p.bytes(),
            })
        })
        .collect();
    Value::Array(ports)
}

/// The manifest: what the object holds and how its memory is laid out.
pub(super) fn manifest(
    m: &AotModel,
    s: &Schedule,
    built: &super::model_layout::Built,
    kernels: &[(String, String)],
) -> String {
    use super::model_layout::Place;
    let buffers: Vec<Value> = s
        .buffers
        .iter()
        .zip(&built.places)
        .map(|(b, place)| {
            let (kind, at) = match *place {
                Place::Input(i) => ("input", i),
                Place::Scratch(o) => ("scratch", o),
                Place::Const(o) => ("constant", o),
                Place::Unused => ("unused", 0),
            };
            json!({
                "name": b.name,
                "dtype": b.dtype.to_string(),
                "shape": b.shape,
                "bytes": b.len() * b.dtype.size(),
                "place": kind,
                "offset": at,
            })
        })
        .collect();
    let kernel_list: Vec<Value> = kernels
        .iter()
        .map(|(k, sym)| json!({"kernel": k, "symbol": sym}))
        .collect();
    let manifest = json!({
        "name": m.name,
        "graph": m.graph,
        "target": "cpu",
        "cpu": m.cpu.name(),
        "triple": m.cpu.triple(),
        "cpu_features": m.features,
        "smelt_version": env!("CARGO_PKG_VERSION"),
        "plan_format": smelt_rt::model::FORMAT,
        "entry": format!("{}_run", m.name),
        "inputs": ports_json(&m.inputs),
        "outputs": ports_json(&m.outputs),
        "scratch_bytes": m.scratch_bytes,
        "constant_bytes": built.consts.len(),
        // the object is the constants, the plan and the code (with ELF's tables)
        "object_bytes": m.object.len(),
        "kernels": kernel_list,
        "steps": built.steps,
        "buffers": buffers,
    });
    format!("{manifest}\n")
}

/// Refuses an object that calls a function the run-time library (or libc/libm) lacks,
/// naming it: the link would fail otherwise, far from the cause.
pub(super) fn check_imports(bytes: &[u8]) -> Result<()> {
    use object::{Object, ObjectSection, ObjectSymbol, RelocationTarget};
    let file = object::File::parse(bytes)
        .map_err(|e| Error::Unsupported(format!("aot: reading back the object: {e}")))?;
    let mut known: Vec<&str> = smelt_rt::helpers().iter().map(|h| h.0).collect();
    known.extend(["smelt_rt_run", "smelt_rt_error_string"]);
    // libc and libm hold these for a C program
    known.extend(smelt_rt::libcalls::NAMES);
    for section in file.sections() {
        for (_, r) in section.relocations() {
            let RelocationTarget::Symbol(i) = r.target() else {
                continue;
            };
            let Ok(sym) = file.symbol_by_index(i) else {
                continue;
            };
            let name = sym.name().unwrap_or("");
            if sym.is_undefined() && !known.contains(&name) {
                bail!(
                    Unsupported,
                    "aot: the model calls {name}, which the run-time library does not have"
                );
            }
        }
    }
    Ok(())
}

/// Writes a static library `path` holding the object `member`.
pub(super) fn write_archive(path: &Path, member: &str, object: &[u8]) -> Result<()> {
    let members = [ar_archive_writer::NewArchiveMember::new(
        object,
        &ar_archive_writer::DEFAULT_OBJECT_READER,
        member.to_string(),
    )];
    let mut out = std::io::Cursor::new(Vec::new());
    ar_archive_writer::write_archive_to_stream(
        &mut out,
        &members,
        ar_archive_writer::ArchiveKind::Gnu,
        false,
        None,
    )
    .map_err(|e| Error::Io(format!("{}: {e}", path.display())))?;
    write(path, &out.into_inner())
}

/// The run-time library a C program links (`libsmelt_rt.a`): `SMELT_RT_LIB` when set, else
/// the newest one beside the running executable or one directory up (`cargo build
/// --workspace` puts it next to `smelt`), or in their `deps/` (`libsmelt_rt-HASH.a`, built as
/// a dependency of test and example executables).
pub fn runtime_library() -> Result<PathBuf> {
    if let Some(p) = std::env::var_os("SMELT_RT_LIB") {
        let p = PathBuf::from(p);
        if p.is_file() {
            return Ok(p);
        }
        bail!(Io, "SMELT_RT_LIB={}: no such file", p.display());
    }
    let exe = std::env::current_exe().map_err(|e| Error::Io(format!("current executable: {e}")))?;
    // the newest candidate: an older uplifted copy must not shadow a fresh build
    let newest = exe
        .ancestors()
        .skip(1)
        .take(2)
        .flat_map(|d| [d.to_path_buf(), d.join("deps")])
        .filter_map(|d| std::fs::read_dir(d).ok())
        .flatten()
        .filter_map(|e| e.ok())
        .filter(|e| {
            let n = e.file_name();
            let n = n.to_string_lossy();
            n == "libsmelt_rt.a" || (n.starts_with("libsmelt_rt-") && n.ends_with(".a"))
        })
        .filter_map(|e| Some((e.metadata().ok()?.modified().ok()?, e.path())))
        .max();
    if let Some((_, p)) = newest {
        return Ok(p);
    }
    bail!(
        Io,
        "libsmelt_rt.a not found beside {}: build it with `cargo build --release -p smelt-rt` (it lands in target/release/) or set SMELT_RT_LIB to its path",
        exe.display()
    )
}

/// What a C compiler needs after the object to link a program: the run-time library and
/// the system libraries Rust's standard library uses.
pub fn link_flags(runtime: &Path) -> String {
    format!("{} {}", runtime.display(), SYSTEM_LIBS.join(" "))
}

/// The system libraries Rust's standard library uses, as linker flags.
const SYSTEM_LIBS: [&str; 6] = ["-lpthread", "-ldl", "-lm", "-lrt", "-lgcc_s", "-lc"];

/// Links `DIR/NAME.o` (written by [`AotModel::write`]) and the run-time library `runtime`
/// into `DIR/libNAME.so` with the C compiler (`$CC`, else `cc`): one shared library that
/// `dlopen`, Python's `ctypes` or any FFI loads, with the object's C interface. A version
/// script keeps every symbol but the model's own (`NAME_*`) local, so two models, or a
/// model and a program with its own copy of the run-time library, never clash.
pub fn link_shared(m: &AotModel, dir: &Path, runtime: &Path) -> Result<PathBuf> {
    let script = dir.join(format!("{}.map", m.name));
    let text = format!("{{\n  global: {}_*;\n  local: *;\n}};\n", m.name);
    write(&script, text.as_bytes())?;
    let so = dir.join(format!("lib{}.so", m.name));
    let cc = std::env::var("CC").unwrap_or_else(|_| "cc".into());
    let out = std::process::Command::new(&cc)
        .arg("-shared")
        .arg("-o")
        .arg(&so)
        .arg(dir.join(format!("{}.o", m.name)))
        .arg(runtime)
        .arg(format!("-Wl,--version-script={}", script.display()))
        .args(SYSTEM_LIBS)
        .output()
        .map_err(|e| Error::Io(format!("running the C compiler `{cc}`: {e}")))?;
    if !out.status.success() {
        bail!(
            Io,
            "linking {} with `{cc}`: {}",
            so.display(),
            String::from_utf8_lossy(&out.stderr).trim()
        );
    }
    Ok(so)
}
