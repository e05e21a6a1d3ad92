//! Writes small BTF files for the reader's tests: the shapes of kernels
//! this machine does not run (6.1's `struct mm_rss_stat`), and broken ones.

/// BTF under construction: types are numbered from 1 in the order added.
pub struct BtfWriter {
    types: Vec<u8>,
    strings: Vec<u8>,
    next_id: u32,
}

pub const INT: u32 = 1;
pub const STRUCT: u32 = 4;
pub const UNION: u32 = 5;
pub const ENUM: u32 = 6;
pub const TYPEDEF: u32 = 8;
pub const PTR: u32 = 2;
pub const ARRAY: u32 = 3;
pub const CONST: u32 = 10;
pub const FUNC_PROTO: u32 = 13;
pub const ENUM64: u32 = 19;

impl Default for BtfWriter {
    fn default() -> Self {
        Self {
            types: Vec::new(),
            // Offset 0 is the empty name.
            strings: vec![0],
            next_id: 1,
        }
    }
}

impl BtfWriter {
    pub fn name(&mut self, name: &str) -> u32 {
        if name.is_empty() {
            return 0;
        }
        let offset = self.strings.len() as u32;
        self.strings.extend_from_slice(name.as_bytes());
        self.strings.push(0);
        offset
    }

    /// A `btf_type` and its trailing words; returns its id.
    pub fn raw(
        &mut self,
        name: &str,
        kind: u32,
        kind_flag: bool,
        vlen: u32,
        size_or_type: u32,
        trailer: &[u32],
    ) -> u32 {
        let name = self.name(name);
        let info = u32::from(kind_flag) << 31 | kind << 24 | vlen;
        for word in [name, info, size_or_type].iter().chain(trailer) {
            self.types.extend_from_slice(&word.to_ne_bytes());
        }
        self.next_id += 1;
        self.next_id - 1
    }

    pub fn int(&mut self, name: &str, bytes: u32) -> u32 {
        self.raw(name, INT, false, 0, bytes, &[bytes * 8])
    }

    /// `members`: (name, type id, bit offset).
    pub fn strukt(
        &mut self,
        kind: u32,
        name: &str,
        size: u32,
        members: &[(&str, u32, u32)],
    ) -> u32 {
        let mut trailer = Vec::new();
        for &(member, type_id, bits) in members {
            let name = self.name(member);
            trailer.extend([name, type_id, bits]);
        }
        self.raw(name, kind, false, members.len() as u32, size, &trailer)
    }

    pub fn enumeration(&mut self, name: &str, values: &[(&str, u32)]) -> u32 {
        let mut trailer = Vec::new();
        for &(value_name, value) in values {
            let name = self.name(value_name);
            trailer.extend([name, value]);
        }
        self.raw(name, ENUM, false, values.len() as u32, 4, &trailer)
    }

    pub fn alias(&mut self, kind: u32, name: &str, type_id: u32) -> u32 {
        self.raw(name, kind, false, 0, type_id, &[])
    }

    pub fn array(&mut self, element: u32, index: u32, nelems: u32) -> u32 {
        self.raw("", ARRAY, false, 0, 0, &[element, index, nelems])
    }

    /// A `typedef void (*btf_trace_<name>)(void *, ...)` with `arguments`
    /// after the context.
    pub fn tracepoint(&mut self, name: &str, arguments: u32) -> u32 {
        let mut params = vec![0, 0];
        params.extend((0..arguments).flat_map(|_| [0, 0]));
        let proto = self.raw("", FUNC_PROTO, false, arguments + 1, 0, &params);
        let pointer = self.alias(PTR, "", proto);
        self.alias(TYPEDEF, &format!("btf_trace_{name}"), pointer)
    }

    /// The file: header, types, strings.
    pub fn finish(&self) -> Vec<u8> {
        let mut file = Vec::new();
        file.extend_from_slice(&0xeb9fu16.to_ne_bytes());
        file.extend([1, 0]);
        let types = self.types.len() as u32;
        let strings = self.strings.len() as u32;
        for word in [24, 0, types, types, strings] {
            file.extend_from_slice(&u32::to_ne_bytes(word));
        }
        file.extend_from_slice(&self.types);
        file.extend_from_slice(&self.strings);
        file
    }
}
