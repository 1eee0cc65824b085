//! How much memory a model will take before it is loaded: the GGUF file plus its KV cache at
//! the descriptor's context size, from the file's metadata (the header only; the tensors are
//! not read).

use std::io::{BufReader, Read, Seek};
use std::path::Path;

/// Key/value metadata entries read at most; real files have a few dozen.
const MAX_KV: u64 = 100_000;
/// Bytes per KV-cache element: llama-server's default cache type is f16.
const KV_ELEMENT_BYTES: u64 = 2;

/// The estimate in bytes: the file size, plus `2 × layers × context × (K + V width) × 2` for
/// the f16 KV cache when the metadata names the shape. `None` when the file cannot be read.
pub(super) fn estimate_bytes(path: &Path, context_size: u32) -> Option<u64> {
    let size = std::fs::metadata(path).ok()?.len();
    let kv = read_shape(path)
        .map(|s| s.layers * u64::from(context_size) * (s.k_width + s.v_width) * KV_ELEMENT_BYTES)
        .unwrap_or(0);
    Some(size.saturating_add(kv))
}

#[derive(Debug, Default, PartialEq)]
struct Shape {
    layers: u64,
    k_width: u64,
    v_width: u64,
}

#[derive(Default)]
struct Meta {
    arch: Option<String>,
    ints: Vec<(String, u64)>,
}

impl Meta {
    fn int(&self, key: &str) -> Option<u64> {
        self.ints.iter().find(|(k, _)| k == key).map(|(_, v)| *v)
    }
}

fn read_shape(path: &Path) -> Option<Shape> {
    let mut r = BufReader::new(std::fs::File::open(path).ok()?);
    let meta = read_meta(&mut r)?;
    let arch = meta.arch.as_deref()?;
    let key = |k: &str| meta.int(&format!("{arch}.{k}"));
    let layers = key("block_count")?;
    let embd = key("embedding_length")?;
    let heads = key("attention.head_count").filter(|h| *h > 0)?;
    let kv_heads = key("attention.head_count_kv").unwrap_or(heads);
    let head_k = key("attention.key_length").unwrap_or(embd / heads);
    let head_v = key("attention.value_length").unwrap_or(embd / heads);
    Some(Shape {
        layers,
        k_width: kv_heads * head_k,
        v_width: kv_heads * head_v,
    })
}

fn u32_of(r: &mut impl Read) -> Option<u32> {
    let mut b = [0u8; 4];
    r.read_exact(&mut b).ok()?;
    Some(u32::from_le_bytes(b))
}

fn u64_of(r: &mut impl Read) -> Option<u64> {
    let mut b = [0u8; 8];
    r.read_exact(&mut b).ok()?;
    Some(u64::from_le_bytes(b))
}

/// Skips `n` bytes; within a `BufReader` without a read (the vocabulary's 262,144 strings
/// are skipped one by one).
fn skip(r: &mut (impl Read + Seek), n: u64) -> Option<()> {
    r.seek_relative(i64::try_from(n).ok()?).ok()
}

fn string_of(r: &mut (impl Read + Seek)) -> Option<String> {
    let n = u64_of(r)?;
    if n > 1 << 20 {
        return None;
    }
    let mut b = vec![0u8; n as usize];
    r.read_exact(&mut b).ok()?;
    String::from_utf8(b).ok()
}

/// Reads the header's key/value pairs, keeping `general.architecture` and the integers.
fn read_meta(r: &mut (impl Read + Seek)) -> Option<Meta> {
    let mut magic = [0u8; 4];
    r.read_exact(&mut magic).ok()?;
    if &magic != b"GGUF" || u32_of(r)? < 2 {
        return None;
    }
    let _tensors = u64_of(r)?;
    let count = u64_of(r)?;
    if count > MAX_KV {
        return None;
    }
    let mut meta = Meta::default();
    for _ in 0..count {
        let key = string_of(r)?;
        let ty = u32_of(r)?;
        match ty {
            8 if key == "general.architecture" => meta.arch = Some(string_of(r)?),
            _ => {
                if let Some(v) = value(r, ty)? {
                    meta.ints.push((key, v));
                }
            }
        }
    }
    Some(meta)
}

/// A little-endian integer of `n` bytes (1, 2, 4 or 8).
fn fixed(r: &mut impl Read, n: usize) -> Option<u64> {
    let mut b = [0u8; 8];
    r.read_exact(&mut b[..n]).ok()?;
    Some(u64::from_le_bytes(b))
}

/// The size of a GGUF value of type `ty` when it is fixed (numbers and booleans).
fn size_of_fixed(ty: u32) -> Option<u64> {
    match ty {
        0 | 1 | 7 => Some(1),
        2 | 3 => Some(2),
        4..=6 => Some(4),
        10..=12 => Some(8),
        _ => None,
    }
}

/// Reads one value of GGUF type `ty`: integers come back, everything else is skipped.
fn value(r: &mut (impl Read + Seek), ty: u32) -> Option<Option<u64>> {
    Some(match ty {
        0 | 1 | 7 => Some(fixed(r, 1)?),
        2 | 3 => Some(fixed(r, 2)?),
        4 | 5 => Some(fixed(r, 4)?),
        10 | 11 => Some(fixed(r, 8)?),
        6 => {
            fixed(r, 4)?;
            None
        }
        12 => {
            fixed(r, 8)?;
            None
        }
        8 => {
            let n = u64_of(r)?;
            skip(r, n)?;
            None
        }
        9 => {
            let inner = u32_of(r)?;
            let n = u64_of(r)?;
            match size_of_fixed(inner) {
                // An array of numbers is skipped whole.
                Some(size) => skip(r, n.checked_mul(size)?)?,
                None => {
                    for _ in 0..n {
                        value(r, inner)?;
                    }
                }
            }
            None
        }
        _ => return None,
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    fn kv_int(out: &mut Vec<u8>, key: &str, v: u32) {
        out.extend((key.len() as u64).to_le_bytes());
        out.extend(key.as_bytes());
        out.extend(4u32.to_le_bytes());
        out.extend(v.to_le_bytes());
    }

    #[test]
    fn the_kv_cache_is_estimated_from_the_header() {
        let mut f = b"GGUF".to_vec();
        f.extend(3u32.to_le_bytes());
        f.extend(0u64.to_le_bytes());
        f.extend(6u64.to_le_bytes());
        let arch = "general.architecture";
        f.extend((arch.len() as u64).to_le_bytes());
        f.extend(arch.as_bytes());
        f.extend(8u32.to_le_bytes());
        f.extend(5u64.to_le_bytes());
        f.extend(b"llama");
        // A string array to skip, as tokenizer vocabularies are.
        let vocab = "tokenizer.ggml.tokens";
        f.extend((vocab.len() as u64).to_le_bytes());
        f.extend(vocab.as_bytes());
        f.extend(9u32.to_le_bytes());
        f.extend(8u32.to_le_bytes());
        f.extend(2u64.to_le_bytes());
        for t in ["<s>", "hi"] {
            f.extend((t.len() as u64).to_le_bytes());
            f.extend(t.as_bytes());
        }
        kv_int(&mut f, "llama.block_count", 32);
        kv_int(&mut f, "llama.embedding_length", 4096);
        kv_int(&mut f, "llama.attention.head_count", 32);
        kv_int(&mut f, "llama.attention.head_count_kv", 8);
        let dir = std::env::temp_dir().join(format!("correx-gguf-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        let path = dir.join("m.gguf");
        std::fs::write(&path, &f).unwrap();
        // 8 KV heads × 128 wide, K and V, 32 layers, f16: 128 KiB per token.
        let want = f.len() as u64 + 32 * 1000 * (1024 + 1024) * 2;
        assert_eq!(estimate_bytes(&path, 1000), Some(want));
        // Not a GGUF: the file size alone.
        std::fs::write(&path, b"not a model").unwrap();
        assert_eq!(estimate_bytes(&path, 1000), Some(11));
        let _ = std::fs::remove_dir_all(&dir);
    }
}
