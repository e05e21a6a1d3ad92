//! The BTF format, as the kernel's `Documentation/bpf/btf.rst` describes
//! it: a header, a type section and a string section, in the byte order of
//! the machine. A type is a 12-byte `btf_type` (name offset, info word,
//! size or referenced type id) followed by data whose size its kind and
//! `vlen` give; type ids count from 1 in file order (0 is `void`).
//!
//! [`Btf::parse`] walks the type section once to check every extent and
//! name and to note where each type starts; nothing else is decoded until
//! asked for.
use std::ops::Range;

const MAGIC: u16 = 0xeb9f;
const HEADER_LEN: usize = 24;
const TYPE_LEN: usize = 12;
/// Typedefs and qualifiers followed to reach a type; the kernel's own
/// limit on such chains is far lower.
const MAX_CHAIN: usize = 64;

#[derive(Debug, Clone, thiserror::Error)]
pub enum FormatError {
    #[error("{0} bytes is too short for a BTF header")]
    Short(usize),
    #[error("no BTF magic (0x{0:04x} instead of 0xeb9f)")]
    Magic(u16),
    #[error("BTF version {0} (this evictd reads version 1)")]
    Version(u8),
    #[error("the {0} section lies outside the file")]
    Section(&'static str),
    #[error("the string section does not end in a NUL")]
    Strings,
    #[error("type {id} runs past the end of the type section")]
    Truncated { id: u32 },
    #[error("type {id} is of kind {kind}, which this evictd does not know")]
    UnknownKind { id: u32, kind: u32 },
    #[error("type {id} names string offset {offset}, outside the string section")]
    Name { id: u32, offset: u32 },
    #[error("type id {0} does not exist")]
    NoSuchType(u32),
    #[error("type {0} starts a chain of typedefs and qualifiers that does not end")]
    Chain(u32),
}

/// The kinds of type BTF has (`BTF_KIND_*`), and `Void` for type id 0.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Kind {
    Void,
    Int,
    Ptr,
    Array,
    Struct,
    Union,
    Enum,
    Fwd,
    Typedef,
    Volatile,
    Const,
    Restrict,
    Func,
    FuncProto,
    Var,
    Datasec,
    Float,
    DeclTag,
    TypeTag,
    Enum64,
}

impl Kind {
    fn from_info(kind: u32) -> Option<Self> {
        Some(match kind {
            1 => Self::Int,
            2 => Self::Ptr,
            3 => Self::Array,
            4 => Self::Struct,
            5 => Self::Union,
            6 => Self::Enum,
            7 => Self::Fwd,
            8 => Self::Typedef,
            9 => Self::Volatile,
            10 => Self::Const,
            11 => Self::Restrict,
            12 => Self::Func,
            13 => Self::FuncProto,
            14 => Self::Var,
            15 => Self::Datasec,
            16 => Self::Float,
            17 => Self::DeclTag,
            18 => Self::TypeTag,
            19 => Self::Enum64,
            _ => return None,
        })
    }

    /// Bytes after the `btf_type` of a type of this kind with `vlen`
    /// entries, and where the name offset sits in each entry, if entries
    /// have names.
    fn trailer(self, vlen: usize) -> (usize, Option<usize>) {
        match self {
            Self::Int | Self::Var | Self::DeclTag => (4, None),
            Self::Array => (12, None),
            // btf_member { name_off, type, offset }
            Self::Struct | Self::Union => (12 * vlen, Some(12)),
            // btf_enum { name_off, val }
            Self::Enum => (8 * vlen, Some(8)),
            // btf_param { name_off, type }
            Self::FuncProto => (8 * vlen, Some(8)),
            // btf_var_secinfo { type, offset, size }
            Self::Datasec => (12 * vlen, None),
            // btf_enum64 { name_off, val_lo32, val_hi32 }
            Self::Enum64 => (12 * vlen, Some(12)),
            Self::Void
            | Self::Ptr
            | Self::Fwd
            | Self::Typedef
            | Self::Volatile
            | Self::Const
            | Self::Restrict
            | Self::Func
            | Self::Float
            | Self::TypeTag => (0, None),
        }
    }

    /// Whether the type only names or qualifies the type it refers to.
    fn is_alias(self) -> bool {
        matches!(
            self,
            Self::Typedef | Self::Volatile | Self::Const | Self::Restrict | Self::TypeTag
        )
    }
}

/// One type's `btf_type`, decoded.
#[derive(Debug, Clone, Copy)]
pub(crate) struct Type {
    pub kind: Kind,
    pub name_off: u32,
    /// Members, enumerators or parameters that follow.
    pub vlen: usize,
    kind_flag: bool,
    /// `size` (integers, structs, unions, enums) or `type` (pointers,
    /// typedefs, qualifiers, prototypes' return type): one field in BTF.
    size_or_type: u32,
    /// Where the type's data starts (after its `btf_type`) in the file.
    data: usize,
}

impl Type {
    /// Size in bytes of a struct, union, enum or integer.
    pub(crate) fn size(&self) -> u32 {
        self.size_or_type
    }

    /// The type a pointer, typedef or qualifier refers to.
    pub(crate) fn referenced(&self) -> u32 {
        self.size_or_type
    }
}

/// A struct or union member.
#[derive(Debug, Clone, Copy)]
pub(crate) struct Member {
    pub name_off: u32,
    pub type_id: u32,
    pub bit_offset: u32,
}

/// An enum's (or enum64's) named value.
#[derive(Debug, Clone, Copy)]
pub(crate) struct Enumerator {
    pub name_off: u32,
    pub value: u64,
}

/// An array's `btf_array`.
#[derive(Debug, Clone, Copy)]
pub(crate) struct Array {
    pub nelems: u32,
}

/// A BTF file and where each of its types starts.
pub(crate) struct Btf {
    data: Vec<u8>,
    strings: Range<usize>,
    /// Offset in `data` of type id `i + 1`'s `btf_type`.
    starts: Vec<u32>,
}

impl Btf {
    /// Checks the header, every type's extent and kind, and every name
    /// offset, so the look-ups after it cannot read out of bounds.
    pub(crate) fn parse(data: Vec<u8>) -> Result<Self, FormatError> {
        if data.len() < HEADER_LEN {
            return Err(FormatError::Short(data.len()));
        }
        let magic = u16::from_ne_bytes([data[0], data[1]]);
        if magic != MAGIC {
            return Err(FormatError::Magic(magic));
        }
        if data[2] != 1 {
            return Err(FormatError::Version(data[2]));
        }
        let word = |at: usize| u32_at(&data, at) as usize;
        let header_len = word(4);
        let section = |name, offset: usize, len: usize| {
            let start = header_len.checked_add(offset);
            let end = start.and_then(|start| start.checked_add(len));
            match (start, end) {
                (Some(start), Some(end))
                    if header_len >= HEADER_LEN
                        && end <= data.len()
                        && end <= u32::MAX as usize =>
                {
                    Ok(start..end)
                }
                _ => Err(FormatError::Section(name)),
            }
        };
        let types = section("type", word(8), word(12))?;
        let strings = section("string", word(16), word(20))?;
        if data[strings.clone()].last() != Some(&0) {
            return Err(FormatError::Strings);
        }
        let name_in_strings = |id, offset: u32| {
            if (offset as usize) < strings.len() {
                Ok(())
            } else {
                Err(FormatError::Name { id, offset })
            }
        };
        let mut starts = Vec::with_capacity(types.len() / TYPE_LEN);
        let mut at = types.start;
        while at < types.end {
            let id = starts.len() as u32 + 1;
            if types.end - at < TYPE_LEN {
                return Err(FormatError::Truncated { id });
            }
            let info = u32_at(&data, at + 4);
            let kind = Kind::from_info((info >> 24) & 0x1f).ok_or(FormatError::UnknownKind {
                id,
                kind: (info >> 24) & 0x1f,
            })?;
            let vlen = (info & 0xffff) as usize;
            let (trailer, entry_name) = kind.trailer(vlen);
            let end = at + TYPE_LEN + trailer;
            if end > types.end {
                return Err(FormatError::Truncated { id });
            }
            name_in_strings(id, u32_at(&data, at))?;
            if let Some(entry) = entry_name {
                for entry_at in (at + TYPE_LEN..end).step_by(entry) {
                    name_in_strings(id, u32_at(&data, entry_at))?;
                }
            }
            starts.push(at as u32);
            at = end;
        }
        Ok(Self {
            data,
            strings,
            starts,
        })
    }

    /// Type `id`; `void` for 0.
    pub(crate) fn get(&self, id: u32) -> Result<Type, FormatError> {
        if id == 0 {
            return Ok(Type {
                kind: Kind::Void,
                name_off: 0,
                vlen: 0,
                kind_flag: false,
                size_or_type: 0,
                data: 0,
            });
        }
        let at = *self
            .starts
            .get(id as usize - 1)
            .ok_or(FormatError::NoSuchType(id))? as usize;
        let info = self.word(at + 4);
        Ok(Type {
            // Checked by parse().
            kind: Kind::from_info((info >> 24) & 0x1f).unwrap_or(Kind::Void),
            name_off: self.word(at),
            vlen: (info & 0xffff) as usize,
            kind_flag: info >> 31 == 1,
            size_or_type: self.word(at + 8),
            data: at + TYPE_LEN,
        })
    }

    /// Every type, in id order.
    pub(crate) fn types(&self) -> impl Iterator<Item = Type> + '_ {
        (1..=self.starts.len() as u32).filter_map(|id| self.get(id).ok())
    }

    /// Type `id`, past typedefs and qualifiers.
    pub(crate) fn resolve(&self, id: u32) -> Result<Type, FormatError> {
        let mut ty = self.get(id)?;
        for _ in 0..MAX_CHAIN {
            if !ty.kind.is_alias() {
                return Ok(ty);
            }
            ty = self.get(ty.referenced())?;
        }
        Err(FormatError::Chain(id))
    }

    /// The string at `offset` (checked by parse() for every name a type
    /// holds), without its NUL.
    pub(crate) fn name(&self, offset: u32) -> &[u8] {
        let rest = self
            .data
            .get(self.strings.start + offset as usize..self.strings.end)
            .unwrap_or_default();
        let len = rest.iter().position(|&b| b == 0).unwrap_or(rest.len());
        &rest[..len]
    }

    /// Whether the string at `offset` is `wanted`: compared in place, with
    /// no search for the NUL first, as look-ups that pass many names (the
    /// enumerators of every enum) do.
    pub(crate) fn name_is(&self, offset: u32, wanted: &str) -> bool {
        let wanted = wanted.as_bytes();
        let rest = self
            .data
            .get(self.strings.start + offset as usize..self.strings.end)
            .unwrap_or_default();
        rest.starts_with(wanted) && rest.get(wanted.len()) == Some(&0)
    }

    /// A struct's or union's members (none for other kinds).
    pub(crate) fn members(&self, ty: &Type) -> impl Iterator<Item = Member> + '_ {
        let count = if matches!(ty.kind, Kind::Struct | Kind::Union) {
            ty.vlen
        } else {
            0
        };
        let (data, kind_flag) = (ty.data, ty.kind_flag);
        (0..count).map(move |i| {
            let at = data + 12 * i;
            let offset = self.word(at + 8);
            Member {
                name_off: self.word(at),
                type_id: self.word(at + 4),
                // With kind_flag the top byte is the bitfield's size.
                bit_offset: if kind_flag {
                    offset & 0xff_ffff
                } else {
                    offset
                },
            }
        })
    }

    /// An enum's or enum64's enumerators (none for other kinds).
    pub(crate) fn enumerators(&self, ty: &Type) -> impl Iterator<Item = Enumerator> + '_ {
        let (count, stride) = match ty.kind {
            Kind::Enum => (ty.vlen, 8),
            Kind::Enum64 => (ty.vlen, 12),
            _ => (0, 8),
        };
        let (data, wide) = (ty.data, ty.kind == Kind::Enum64);
        (0..count).map(move |i| {
            let at = data + stride * i;
            let low = u64::from(self.word(at + 4));
            let value = if wide {
                u64::from(self.word(at + 8)) << 32 | low
            } else {
                low
            };
            Enumerator {
                name_off: self.word(at),
                value,
            }
        })
    }

    /// An array's dimensions, if `ty` is one.
    pub(crate) fn array(&self, ty: &Type) -> Option<Array> {
        (ty.kind == Kind::Array).then(|| Array {
            nelems: self.word(ty.data + 8),
        })
    }

    /// The 32-bit word at `at`, which parse() has checked lies inside the
    /// type section.
    fn word(&self, at: usize) -> u32 {
        u32_at(&self.data, at)
    }
}

/// The native-endian u32 at `at`; 0 past the end (callers stay within
/// extents parse() checked).
fn u32_at(data: &[u8], at: usize) -> u32 {
    data.get(at..at + 4)
        .and_then(|bytes| bytes.try_into().ok())
        .map_or(0, u32::from_ne_bytes)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::kernel::btf::fixtures::{self as w, BtfWriter};

    fn parse(writer: &BtfWriter) -> Btf {
        Btf::parse(writer.finish()).expect("valid BTF")
    }

    #[test]
    fn resolves_names_members_and_aliases() {
        let mut writer = BtfWriter::default();
        let int = writer.int("int", 4);
        let inner = writer.strukt(w::UNION, "", 4, &[("a", int, 0), ("b", int, 0)]);
        let outer = writer.strukt(w::STRUCT, "outer", 8, &[("x", int, 0), ("", inner, 32)]);
        let konst = writer.alias(w::CONST, "", outer);
        let typedef = writer.alias(w::TYPEDEF, "outer_t", konst);
        let btf = parse(&writer);

        let named = |name| {
            btf.types()
                .filter(|ty| btf.name_is(ty.name_off, name))
                .map(|ty| ty.kind)
                .collect::<Vec<Kind>>()
        };
        assert_eq!(named("outer"), [Kind::Struct]);
        // A name is matched whole: not by a prefix, nor by a longer name.
        assert_eq!(named("out"), []);
        assert_eq!(named("outer_"), []);
        assert_eq!(named("outer_t"), [Kind::Typedef]);
        assert_eq!(named("outer_t_and_more"), []);
        let resolved = btf.resolve(typedef).expect("resolves");
        assert_eq!((resolved.kind, resolved.size()), (Kind::Struct, 8));
        assert_eq!(btf.members(&btf.get(outer).expect("outer")).count(), 2);
        let members: Vec<(Vec<u8>, u32, u32)> = btf
            .members(&resolved)
            .map(|m| (btf.name(m.name_off).to_vec(), m.type_id, m.bit_offset))
            .collect();
        assert_eq!(members, [(b"x".to_vec(), int, 0), (Vec::new(), inner, 32)]);
        assert_eq!(btf.get(0).expect("void").kind, Kind::Void);
        assert!(matches!(btf.get(99), Err(FormatError::NoSuchType(99))));
    }

    #[test]
    fn bitfield_members_keep_their_size_out_of_the_offset() {
        let mut writer = BtfWriter::default();
        let int = writer.int("int", 4);
        let name = writer.name("flag");
        // kind_flag: bitfield size 3 in the top byte, bit offset 37.
        let s = writer.raw("s", w::STRUCT, true, 1, 8, &[name, int, 3 << 24 | 37]);
        let btf = parse(&writer);
        let member = btf.members(&btf.get(s).expect("s")).next().expect("member");
        assert_eq!(member.bit_offset, 37);
    }

    #[test]
    fn enumerators_of_both_widths() {
        let mut writer = BtfWriter::default();
        let narrow = writer.enumeration("e", &[("A", 0), ("B", 7)]);
        let a = writer.name("WIDE");
        let wide = writer.raw("e64", w::ENUM64, false, 1, 8, &[a, 0x89ab_cdef, 0x1]);
        let btf = parse(&writer);
        let values = |id| -> Vec<u64> {
            btf.enumerators(&btf.get(id).expect("enum"))
                .map(|e| e.value)
                .collect()
        };
        assert_eq!(values(narrow), [0, 7]);
        assert_eq!(values(wide), [0x1_89ab_cdef]);
    }

    #[test]
    fn broken_files_are_refused_with_the_reason() {
        let mut writer = BtfWriter::default();
        writer.int("int", 4);
        let good = writer.finish();
        let error = |bytes: Vec<u8>| Btf::parse(bytes).err().expect("refused").to_string();

        assert_eq!(
            error(good[..10].to_vec()),
            "10 bytes is too short for a BTF header"
        );
        let mut magic = good.clone();
        magic[0] ^= 0xff;
        assert!(error(magic).starts_with("no BTF magic"));
        let mut version = good.clone();
        version[2] = 2;
        assert_eq!(
            error(version),
            "BTF version 2 (this evictd reads version 1)"
        );
        let mut outside = good.clone();
        outside[20..24].copy_from_slice(&u32::MAX.to_ne_bytes());
        assert_eq!(error(outside), "the string section lies outside the file");

        let mut writer = BtfWriter::default();
        writer.raw("", 31, false, 0, 0, &[]);
        assert_eq!(
            error(writer.finish()),
            "type 1 is of kind 31, which this evictd does not know"
        );
        let mut writer = BtfWriter::default();
        // A struct announcing two members but carrying one.
        writer.raw("s", w::STRUCT, false, 2, 8, &[0, 0, 0]);
        assert_eq!(
            error(writer.finish()),
            "type 1 runs past the end of the type section"
        );
        let mut writer = BtfWriter::default();
        writer.raw("s", w::STRUCT, false, 1, 8, &[1000, 0, 0]);
        assert_eq!(
            error(writer.finish()),
            "type 1 names string offset 1000, outside the string section"
        );
    }

    #[test]
    fn a_loop_of_typedefs_is_an_error_not_a_hang() {
        let mut writer = BtfWriter::default();
        let first = writer.alias(w::TYPEDEF, "a", 2);
        writer.alias(w::TYPEDEF, "b", first);
        let btf = parse(&writer);
        assert!(matches!(btf.resolve(first), Err(FormatError::Chain(1))));
    }
}
