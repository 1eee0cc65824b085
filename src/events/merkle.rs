//! A Merkle tree over the chain, in the shapes of RFC 6962 / RFC 9162 (as transparency logs
//! use), so that a checkpoint commits to every event and one event's place in a log can be
//! shown with a proof of about log₂(n) hashes, without the rest of the log.
//!
//! The leaves are the chained events in position order; leaf data is the event's chain hash
//! (which covers the event and everything before it), so `leaf = SHA-256(0x00 ‖ chain hash)`
//! and `node = SHA-256(0x01 ‖ left ‖ right)`; the root of an empty tree is SHA-256 of nothing.
//! Anyone can check a proof with any SHA-256 and the algorithms of RFC 9162 §2.1.3.2
//! (inclusion) and §2.1.4.2 (consistency), which [`verify_inclusion`] and
//! [`verify_consistency`] are.

use super::chain::ChainHash;
use sha2::{Digest, Sha256};

/// The leaf hash of an event whose chain hash is `chain_hash`.
pub fn leaf_hash(chain_hash: &ChainHash) -> ChainHash {
    let mut h = Sha256::new();
    h.update([0u8]);
    h.update(chain_hash);
    h.finalize().into()
}

fn node_hash(left: &ChainHash, right: &ChainHash) -> ChainHash {
    let mut h = Sha256::new();
    h.update([1u8]);
    h.update(left);
    h.update(right);
    h.finalize().into()
}

/// The root of the empty tree.
pub fn empty_root() -> ChainHash {
    Sha256::digest([]).into()
}

/// The largest power of two smaller than `n` (`n` ≥ 2).
fn split(n: u64) -> u64 {
    1 << (63 - (n - 1).leading_zeros())
}

/// A whole tree held in memory, every level of it, for making proofs.
///
/// Level 0 holds the leaf hashes; level k+1 pairs level k's nodes, an unpaired last node going
/// up unchanged (which is RFC 6962's split at the largest power of two, level by level).
#[derive(Clone, Debug)]
pub struct Tree {
    levels: Vec<Vec<ChainHash>>,
}

impl Tree {
    /// The tree over `leaves` (leaf hashes, in order).
    pub fn new(leaves: Vec<ChainHash>) -> Tree {
        let mut levels = vec![leaves];
        while levels.last().is_some_and(|l| l.len() > 1) {
            let below = &levels[levels.len() - 1];
            let up = below
                .chunks(2)
                .map(|pair| match pair {
                    [l, r] => node_hash(l, r),
                    [one] => *one,
                    _ => unreachable!("chunks(2) yields one or two"),
                })
                .collect();
            levels.push(up);
        }
        Tree { levels }
    }

    /// How many leaves.
    pub fn size(&self) -> u64 {
        self.levels[0].len() as u64
    }

    /// The root (of the empty tree when there are no leaves).
    pub fn root(&self) -> ChainHash {
        match self.levels.last().and_then(|l| l.first()) {
            Some(r) if self.size() > 0 => *r,
            _ => empty_root(),
        }
    }

    /// The hash of the subtree over leaves `start..end` (a non-empty range inside the tree).
    fn range(&self, start: u64, end: u64) -> ChainHash {
        let n = end - start;
        if n.is_power_of_two() && start % n == 0 {
            let level = n.trailing_zeros() as usize;
            return self.levels[level][(start >> level) as usize];
        }
        let k = split(n);
        node_hash(&self.range(start, start + k), &self.range(start + k, end))
    }

    /// The root of the tree's first `size` leaves.
    pub fn root_at(&self, size: u64) -> Option<ChainHash> {
        match size {
            0 => Some(empty_root()),
            s if s <= self.size() => Some(self.range(0, s)),
            _ => None,
        }
    }

    /// The inclusion proof of leaf `index` in the tree's first `size` leaves (RFC 9162
    /// §2.1.3.1); `None` when `index` is not below `size` or `size` is past the tree.
    pub fn inclusion(&self, index: u64, size: u64) -> Option<Vec<ChainHash>> {
        if index >= size || size > self.size() {
            return None;
        }
        let mut out = Vec::new();
        self.path(index, 0, size, &mut out);
        Some(out)
    }

    fn path(&self, m: u64, start: u64, end: u64, out: &mut Vec<ChainHash>) {
        let n = end - start;
        if n <= 1 {
            return;
        }
        let k = split(n);
        if m < k {
            self.path(m, start, start + k, out);
            out.push(self.range(start + k, end));
        } else {
            self.path(m - k, start + k, end, out);
            out.push(self.range(start, start + k));
        }
    }

    /// The consistency proof from the tree's first `old` leaves to its first `new` (RFC 9162
    /// §2.1.4.1); `None` unless `0 < old ≤ new ≤ size`.
    pub fn consistency(&self, old: u64, new: u64) -> Option<Vec<ChainHash>> {
        if old == 0 || old > new || new > self.size() {
            return None;
        }
        let mut out = Vec::new();
        self.subproof(old, 0, new, true, &mut out);
        Some(out)
    }

    fn subproof(&self, m: u64, start: u64, end: u64, whole: bool, out: &mut Vec<ChainHash>) {
        let n = end - start;
        if m == n {
            if !whole {
                out.push(self.range(start, end));
            }
            return;
        }
        let k = split(n);
        if m <= k {
            self.subproof(m, start, start + k, whole, out);
            out.push(self.range(start + k, end));
        } else {
            self.subproof(m - k, start + k, end, false, out);
            out.push(self.range(start, start + k));
        }
    }
}

/// Whether `proof` shows `leaf` (a leaf hash) at `index` in the tree of `size` leaves whose
/// root is `root` (RFC 9162 §2.1.3.2).
pub fn verify_inclusion(
    index: u64,
    size: u64,
    leaf: &ChainHash,
    proof: &[ChainHash],
    root: &ChainHash,
) -> bool {
    if index >= size {
        return false;
    }
    let (mut f, mut s, mut r) = (index, size - 1, *leaf);
    for p in proof {
        if s == 0 {
            return false;
        }
        if f & 1 == 1 || f == s {
            r = node_hash(p, &r);
            while f & 1 == 0 && f != 0 {
                f >>= 1;
                s >>= 1;
            }
        } else {
            r = node_hash(&r, p);
        }
        f >>= 1;
        s >>= 1;
    }
    s == 0 && r == *root
}

/// Whether `proof` shows the tree of `new` leaves with root `new_root` extends the tree of
/// `old` leaves with root `old_root`: the log only grew (RFC 9162 §2.1.4.2). Every tree extends
/// the empty one.
pub fn verify_consistency(
    old: u64,
    new: u64,
    old_root: &ChainHash,
    new_root: &ChainHash,
    proof: &[ChainHash],
) -> bool {
    if old > new {
        return false;
    }
    if old == 0 {
        return proof.is_empty() && *old_root == empty_root();
    }
    if old == new {
        return proof.is_empty() && old_root == new_root;
    }
    let mut path: Vec<ChainHash> = Vec::with_capacity(proof.len() + 1);
    if old.is_power_of_two() {
        path.push(*old_root);
    }
    path.extend_from_slice(proof);
    let Some((first, rest)) = path.split_first() else {
        return false;
    };
    let (mut f, mut s) = (old - 1, new - 1);
    while f & 1 == 1 {
        f >>= 1;
        s >>= 1;
    }
    let (mut fr, mut sr) = (*first, *first);
    for c in rest {
        if s == 0 {
            return false;
        }
        if f & 1 == 1 || f == s {
            fr = node_hash(c, &fr);
            sr = node_hash(c, &sr);
            while f & 1 == 0 && f != 0 {
                f >>= 1;
                s >>= 1;
            }
        } else {
            sr = node_hash(&sr, c);
        }
        f >>= 1;
        s >>= 1;
    }
    fr == *old_root && sr == *new_root && s == 0
}

#[cfg(test)]
mod tests {
    use super::*;

    fn leaves(n: u64) -> Vec<ChainHash> {
        (0..n).map(|i| leaf_hash(&[i as u8; 32])).collect()
    }

    /// RFC 6962's definition, as written: MTH(D[n]) split at the largest power of two.
    fn mth(d: &[ChainHash]) -> ChainHash {
        match d.len() {
            0 => empty_root(),
            1 => d[0],
            n => {
                let k = split(n as u64) as usize;
                node_hash(&mth(&d[..k]), &mth(&d[k..]))
            }
        }
    }

    #[test]
    fn the_root_is_rfc_6962s_at_every_size() {
        assert_eq!(
            super::super::chain::to_hex(&empty_root()),
            "e3b0c44298fc1c149afbf4c8996fb92427ae41e4649b934ca495991b7852b855"
        );
        for n in 0..70 {
            let l = leaves(n);
            let t = Tree::new(l.clone());
            assert_eq!(t.root(), mth(&l), "size {n}");
            for m in 0..=n {
                assert_eq!(t.root_at(m), Some(mth(&l[..m as usize])));
            }
        }
    }

    #[test]
    fn every_inclusion_proof_verifies_and_nothing_else_does() {
        for n in 1..40 {
            let t = Tree::new(leaves(n));
            for size in 1..=n {
                let root = t.root_at(size).unwrap();
                for i in 0..size {
                    let leaf = t.levels[0][i as usize];
                    let p = t.inclusion(i, size).unwrap();
                    assert!(verify_inclusion(i, size, &leaf, &p, &root), "{i}/{size}");
                    // Another leaf, another index, a changed or longer proof: refused.
                    assert!(!verify_inclusion(i, size, &[7; 32], &p, &root));
                    if size > 1 {
                        assert!(!verify_inclusion((i + 1) % size, size, &leaf, &p, &root));
                    }
                    for j in 0..p.len() {
                        let mut bad = p.clone();
                        bad[j][0] ^= 1;
                        assert!(!verify_inclusion(i, size, &leaf, &bad, &root));
                    }
                    let mut longer = p.clone();
                    longer.push([0; 32]);
                    assert!(!verify_inclusion(i, size, &leaf, &longer, &root));
                }
                assert_eq!(t.inclusion(size, size), None);
            }
        }
    }

    #[test]
    fn every_consistency_proof_verifies_and_a_rewritten_past_does_not() {
        for n in 1..40 {
            let l = leaves(n);
            let t = Tree::new(l.clone());
            for new in 1..=n {
                let new_root = t.root_at(new).unwrap();
                for old in 1..=new {
                    let old_root = t.root_at(old).unwrap();
                    let p = t.consistency(old, new).unwrap();
                    assert!(verify_consistency(old, new, &old_root, &new_root, &p));
                    // A past that differs in any leaf is not extended by this tree.
                    for changed in 0..old as usize {
                        let mut other = l[..old as usize].to_vec();
                        other[changed][0] ^= 1;
                        assert!(!verify_consistency(old, new, &mth(&other), &new_root, &p));
                    }
                    for j in 0..p.len() {
                        let mut bad = p.clone();
                        bad[j][31] ^= 1;
                        assert!(!verify_consistency(old, new, &old_root, &new_root, &bad));
                    }
                    if old < new {
                        assert!(!verify_consistency(new, old, &new_root, &old_root, &p));
                    }
                }
            }
        }
        assert!(verify_consistency(0, 5, &empty_root(), &[1; 32], &[]));
        assert_eq!(Tree::new(leaves(3)).consistency(0, 3), None);
    }
}
