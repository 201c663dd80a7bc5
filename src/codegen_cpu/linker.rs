//! Loads a relocatable object made by [`super::object::ObjectCode`] into executable memory
//! of this process: a small static linker for the x86-64 ELF relocations Cranelift emits,
//! so that code compiled in an earlier process (the disk cache) runs without Cranelift.
//!
//! The allocated sections are copied into one mapping, followed by a table of addresses (a
//! GOT) for the symbols reached through it and a jump stub per external function called
//! directly; relocations are applied, and the mapping is made read-only and executable,
//! but for the writable sections' pages at its start (a model's call counter).
//! Anything it does not understand (another architecture or relocation type, a symbol it
//! cannot resolve, an offset outside its section) is an error, never a guess.

use crate::{Error, Result};
use object::{Object, ObjectSection, ObjectSymbol, RelocationFlags, RelocationTarget, SectionKind};
use std::collections::HashMap;

/// Machine code loaded from an object; unmapped when dropped.
pub struct Loaded {
    map: memmap2::Mmap,
    /// Addresses of the object's defined symbols, by name.
    symbols: HashMap<String, usize>,
}

impl std::fmt::Debug for Loaded {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(
            f,
            "Loaded({} bytes, {} symbols)",
            self.map.len(),
            self.symbols.len()
        )
    }
}

fn bad(what: impl std::fmt::Display) -> Error {
    Error::Unsupported(format!("loading compiled code: {what}"))
}

impl Loaded {
    /// The address of defined symbol `name`.
    pub fn symbol(&self, name: &str) -> Option<*const u8> {
        self.symbols.get(name).map(|&a| a as *const u8)
    }

    /// Loads `bytes`, resolving undefined symbols with `resolve`.
    pub fn new(bytes: &[u8], resolve: &dyn Fn(&str) -> Option<usize>) -> Result<Loaded> {
        let file = object::File::parse(bytes).map_err(bad)?;
        if file.architecture() != object::Architecture::X86_64 || !cfg!(target_arch = "x86_64") {
            return Err(bad("not x86-64 code for this machine"));
        }
        // lay out the allocated sections: the writable ones (a model's call counter) first,
        // on pages of their own that stay writable, then the code and read-only data
        let mut base: HashMap<object::SectionIndex, usize> = HashMap::new();
        let mut extent: HashMap<object::SectionIndex, usize> = HashMap::new();
        let mut size = 0usize;
        let writable =
            |k: SectionKind| matches!(k, SectionKind::Data | SectionKind::UninitializedData);
        let loaded = |k: SectionKind| {
            matches!(
                k,
                SectionKind::Text
                    | SectionKind::ReadOnlyData
                    | SectionKind::ReadOnlyDataWithRel
                    | SectionKind::ReadOnlyString
            ) || writable(k)
        };
        let mut rw_end = 0;
        for pass_writable in [true, false] {
            for s in file.sections() {
                if !loaded(s.kind()) || writable(s.kind()) != pass_writable {
                    continue;
                }
                let align = usize::try_from(s.align().max(1)).map_err(bad)?;
                let len = usize::try_from(s.size()).map_err(bad)?;
                size = size
                    .checked_next_multiple_of(align)
                    .and_then(|at| at.checked_add(len))
                    .filter(|&end| end <= MAX_IMAGE_BYTES)
                    .ok_or_else(|| bad("sections larger than an object smelt writes"))?;
                base.insert(s.index(), size - len);
                extent.insert(s.index(), len);
            }
            if pass_writable && size > 0 {
                size = size.next_multiple_of(PAGE);
                rw_end = size;
            }
        }
        // symbols, and the GOT slots and stubs of the ones relocations reach indirectly
        let mut addr_of: HashMap<object::SymbolIndex, (String, Option<usize>)> = HashMap::new();
        for sym in file.symbols() {
            if sym.kind() == object::SymbolKind::File {
                continue;
            }
            let name = sym.name().unwrap_or("").to_string();
            let local = match sym.section_index() {
                Some(i) => {
                    let (Some(&b), Some(&len)) = (base.get(&i), extent.get(&i)) else {
                        return Err(bad(format!("{name} in an unloaded section")));
                    };
                    let off = usize::try_from(sym.address())
                        .ok()
                        .filter(|&o| o <= len)
                        .ok_or_else(|| bad(format!("{name} lies outside its section")))?;
                    Some(b + off)
                }
                None => None,
            };
            addr_of.insert(sym.index(), (name, local));
        }
        let mut got: HashMap<object::SymbolIndex, usize> = HashMap::new();
        let mut stubs: HashMap<object::SymbolIndex, usize> = HashMap::new();
        size = size.next_multiple_of(8);
        let relocs: Vec<_> = file
            .sections()
            .filter(|s| base.contains_key(&s.index()))
            .flat_map(|s| {
                s.relocations()
                    .map(move |r| (s.index(), r))
                    .collect::<Vec<_>>()
            })
            .collect();
        for (_, (_, r)) in &relocs {
            let RelocationTarget::Symbol(i) = r.target() else {
                return Err(bad("a relocation against something other than a symbol"));
            };
            let RelocationFlags::Elf { r_type } = r.flags() else {
                return Err(bad("not an ELF relocation"));
            };
            let external = addr_of.get(&i).is_some_and(|(_, a)| a.is_none());
            match r_type {
                object::elf::R_X86_64_GOTPCREL
                | object::elf::R_X86_64_GOTPCRELX
                | object::elf::R_X86_64_REX_GOTPCRELX => {
                    got.entry(i).or_insert_with(|| {
                        size += 8;
                        size - 8
                    });
                }
                object::elf::R_X86_64_PLT32 | object::elf::R_X86_64_PC32 if external => {
                    got.entry(i).or_insert_with(|| {
                        size += 8;
                        size - 8
                    });
                    stubs.entry(i).or_insert_with(|| {
                        size += 8;
                        size - 8
                    });
                }
                _ => {}
            }
        }
        let mut map = memmap2::MmapMut::map_anon(size.max(1)).map_err(bad)?;
        let start = map.as_ptr() as usize;
        for s in file.sections() {
            if let Some(&b) = base.get(&s.index()) {
                let data = s.data().map_err(bad)?;
                if data.len() > extent[&s.index()] {
                    return Err(bad("a section holds more bytes than its size"));
                }
                map[b..b + data.len()].copy_from_slice(data);
            }
        }
        // the absolute address of every symbol a relocation names
        let mut abs: HashMap<object::SymbolIndex, usize> = HashMap::new();
        for (_, (_, r)) in &relocs {
            let RelocationTarget::Symbol(i) = r.target() else {
                continue;
            };
            if abs.contains_key(&i) {
                continue;
            }
            let (name, local) = addr_of
                .get(&i)
                .ok_or_else(|| bad("a relocation against an unknown symbol"))?;
            let a = match local {
                Some(off) => start + off,
                None => resolve(name).ok_or_else(|| bad(format!("unresolved symbol {name}")))?,
            };
            abs.insert(i, a);
        }
        let target = |i: &object::SymbolIndex| {
            abs.get(i)
                .copied()
                .ok_or_else(|| bad("a relocation against an unresolved symbol"))
        };
        for (i, &slot) in &got {
            map[slot..slot + 8].copy_from_slice(&(target(i)? as u64).to_le_bytes());
        }
        for (i, &stub) in &stubs {
            // jmp *[rip + disp32] to the symbol's GOT slot, then two bytes of padding
            let disp = rel32(start + got[i], start + stub + 6)?;
            map[stub..stub + 2].copy_from_slice(&[0xff, 0x25]);
            map[stub + 2..stub + 6].copy_from_slice(&disp.to_le_bytes());
            map[stub + 6..stub + 8].copy_from_slice(&[0xcc, 0xcc]);
        }
        for (section, (offset, r)) in &relocs {
            let RelocationTarget::Symbol(i) = r.target() else {
                continue;
            };
            let RelocationFlags::Elf { r_type } = r.flags() else {
                continue;
            };
            let width = if r_type == object::elf::R_X86_64_64 {
                8
            } else {
                4
            };
            let inside = usize::try_from(*offset).ok().filter(|&o| {
                o.checked_add(width)
                    .is_some_and(|end| end <= extent[section])
            });
            let Some(off) = inside else {
                return Err(bad("a relocation outside its section"));
            };
            let at = base[section] + off;
            let place = start + at;
            let a = r.addend();
            let add = |x: usize| (x as i64).wrapping_add(a) as usize;
            match r_type {
                object::elf::R_X86_64_64 => {
                    map[at..at + 8].copy_from_slice(&(add(target(&i)?) as u64).to_le_bytes())
                }
                object::elf::R_X86_64_GOTPCREL
                | object::elf::R_X86_64_GOTPCRELX
                | object::elf::R_X86_64_REX_GOTPCRELX => {
                    let v = rel32(add(start + got[&i]), place)?;
                    map[at..at + 4].copy_from_slice(&v.to_le_bytes());
                }
                object::elf::R_X86_64_PC32 | object::elf::R_X86_64_PLT32 => {
                    let s = match stubs.get(&i) {
                        Some(&stub) => start + stub,
                        None => target(&i)?,
                    };
                    let v = rel32(add(s), place)?;
                    map[at..at + 4].copy_from_slice(&v.to_le_bytes());
                }
                t => return Err(bad(format!("relocation type {t}"))),
            }
        }
        let map = map.make_exec().map_err(bad)?;
        if rw_end > 0 {
            writable_pages(&map, rw_end)?;
        }
        let symbols = addr_of
            .values()
            .filter_map(|(n, off)| Some((n.clone(), start + (*off)?)))
            .filter(|(n, _)| !n.is_empty())
            .collect();
        Ok(Loaded { map, symbols })
    }
}

/// The page size the writable sections are aligned to.
const PAGE: usize = 4096;

/// Makes the first `len` bytes (whole pages) of `map` readable and writable, not executable.
#[cfg(target_os = "linux")]
fn writable_pages(map: &memmap2::Mmap, len: usize) -> Result<()> {
    // SAFETY: the range is whole pages at the start of a mapping this loader owns (mmap
    // returns page-aligned memory; `len` is a multiple of PAGE within the mapping).
    let rc = unsafe {
        libc::mprotect(
            map.as_ptr() as *mut libc::c_void,
            len.min(map.len()),
            libc::PROT_READ | libc::PROT_WRITE,
        )
    };
    match rc {
        0 => Ok(()),
        _ => Err(bad(std::io::Error::last_os_error())),
    }
}

#[cfg(not(target_os = "linux"))]
fn writable_pages(_: &memmap2::Mmap, _: usize) -> Result<()> {
    Err(bad("writable data outside Linux"))
}

/// The most bytes an object's sections may take when loaded (a model's kernels take a few
/// MiB; anything near this is not an object smelt wrote).
const MAX_IMAGE_BYTES: usize = 1 << 32;

/// `to - from` as a 32-bit displacement.
fn rel32(to: usize, from: usize) -> Result<i32> {
    i32::try_from(to as i64 - from as i64).map_err(|_| bad("a displacement beyond 2 GiB"))
}
