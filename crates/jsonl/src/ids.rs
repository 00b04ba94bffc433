//! Sets and maps of the ids a stream's lines carry (message, item, tool-call ids), without an
//! allocation per id.
//!
//! Counting deduplicates by id, and a real stream's ids are unique: a set of `Vec<u8>` costs
//! one heap allocation per id and a rehash of every key as it grows. [`IdMap`] interns each id's
//! bytes in one arena (a `Vec<u8>`) and keeps, per id, a fixed-size slot (its hash, its place
//! in the arena, its value) in a [`hashbrown::HashTable`]: looking an id up hashes the borrowed
//! bytes once and compares bytes only when the 64-bit hashes agree, so two ids whose hashes
//! collide are still two ids. Growing the table moves the slots, never the ids, and never
//! hashes again. Removing an id leaves its bytes in the arena until the dead bytes outweigh the
//! live ones; then the arena is compacted, so memory follows the ids held, not the ids ever
//! seen.

use std::hash::BuildHasher;

use hashbrown::HashTable;
use rustc_hash::FxBuildHasher;

/// One id: its full hash (so growing never hashes again) and where its bytes are.
#[derive(Clone, Copy, Debug)]
struct Slot<V> {
    hash: u64,
    start: u32,
    len: u32,
    value: V,
}

/// The arena of id bytes: live bytes, and the bytes of removed ids not yet reclaimed.
#[derive(Clone, Debug, Default)]
struct Arena {
    bytes: Vec<u8>,
    dead: usize,
}

impl Arena {
    fn get(&self, start: u32, len: u32) -> &[u8] {
        &self.bytes[start as usize..start as usize + len as usize]
    }

    /// Appends `id`, returning its start; `None` past 4 GiB of live ids.
    fn push(&mut self, id: &[u8]) -> Option<(u32, u32)> {
        let start = u32::try_from(self.bytes.len()).ok()?;
        let len = u32::try_from(id.len()).ok()?;
        start.checked_add(len)?;
        self.bytes.extend_from_slice(id);
        Some((start, len))
    }
}

/// A map from ids (byte strings) to small values, for counters: no allocation per id (see the
/// module's docs). `S` hashes the ids; the default is rustc-hash's, made for short keys.
///
/// ```
/// use stepguard_jsonl::IdMap;
///
/// let mut usage: IdMap<u64> = IdMap::new();
/// assert_eq!(usage.insert(b"msg_1", 10), None);
/// assert_eq!(usage.insert(b"msg_1", 12), Some(10));
/// *usage.get_mut(b"msg_1").unwrap() += 1;
/// assert_eq!(usage.get(b"msg_1"), Some(&13));
/// assert_eq!(usage.remove(b"msg_1"), Some(13));
/// assert!(usage.is_empty());
/// ```
#[derive(Clone)]
pub struct IdMap<V, S = FxBuildHasher> {
    table: HashTable<Slot<V>>,
    arena: Arena,
    hasher: S,
}

impl<V, S> std::fmt::Debug for IdMap<V, S> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("IdMap")
            .field("ids", &self.table.len())
            .field("arena_bytes", &self.arena.bytes.len())
            .finish()
    }
}

impl<V> IdMap<V> {
    /// Creates an empty map.
    pub fn new() -> Self {
        Self::with_hasher(FxBuildHasher)
    }
}

impl<V> Default for IdMap<V> {
    fn default() -> Self {
        Self::new()
    }
}

impl<V, S: BuildHasher> IdMap<V, S> {
    /// Creates an empty map hashing with `hasher` (tests force collisions with a constant one).
    pub fn with_hasher(hasher: S) -> Self {
        IdMap {
            table: HashTable::new(),
            arena: Arena::default(),
            hasher,
        }
    }

    /// The number of ids held.
    pub fn len(&self) -> usize {
        self.table.len()
    }

    /// True when no id is held.
    pub fn is_empty(&self) -> bool {
        self.table.is_empty()
    }

    fn find(&self, id: &[u8]) -> Option<&Slot<V>> {
        let hash = self.hasher.hash_one(id);
        let arena = &self.arena;
        self.table
            .find(hash, |s| s.hash == hash && arena.get(s.start, s.len) == id)
    }

    /// True when `id` is held.
    pub fn contains(&self, id: &[u8]) -> bool {
        self.find(id).is_some()
    }

    /// The value of `id`.
    pub fn get(&self, id: &[u8]) -> Option<&V> {
        self.find(id).map(|s| &s.value)
    }

    /// The value of `id`, to change.
    pub fn get_mut(&mut self, id: &[u8]) -> Option<&mut V> {
        let hash = self.hasher.hash_one(id);
        let arena = &self.arena;
        self.table
            .find_mut(hash, |s| s.hash == hash && arena.get(s.start, s.len) == id)
            .map(|s| &mut s.value)
    }

    /// Sets the value of `id`, returning the one it replaced.
    ///
    /// # Panics
    ///
    /// When the ids held come to more than 4 GiB (the plugin boundary reports a plugin's panic
    /// as an error: counting fails closed).
    pub fn insert(&mut self, id: &[u8], value: V) -> Option<V> {
        let hash = self.hasher.hash_one(id);
        let arena = &self.arena;
        if let Some(slot) = self
            .table
            .find_mut(hash, |s| s.hash == hash && arena.get(s.start, s.len) == id)
        {
            return Some(std::mem::replace(&mut slot.value, value));
        }
        let (start, len) = match self.arena.push(id) {
            Some(at) => at,
            None => {
                self.compact();
                self.arena
                    .push(id)
                    .expect("an id set holds at most 4 GiB of ids")
            }
        };
        self.table.insert_unique(
            hash,
            Slot {
                hash,
                start,
                len,
                value,
            },
            |s| s.hash,
        );
        None
    }

    /// Removes `id`, returning its value.
    pub fn remove(&mut self, id: &[u8]) -> Option<V> {
        let hash = self.hasher.hash_one(id);
        let arena = &self.arena;
        let entry = self
            .table
            .find_entry(hash, |s| s.hash == hash && arena.get(s.start, s.len) == id)
            .ok()?;
        let (slot, _) = entry.remove();
        self.arena.dead += slot.len as usize;
        if self.table.is_empty() {
            self.arena.bytes.clear();
            self.arena.dead = 0;
        } else if self.arena.dead > 4096 && self.arena.dead > self.arena.bytes.len() / 2 {
            self.compact();
        }
        Some(slot.value)
    }

    /// Copies the live ids into a fresh arena: dead bytes are reclaimed, and the memory held
    /// is at most twice the live ids (amortised: a compaction follows at least as many removed
    /// bytes as it copies).
    fn compact(&mut self) {
        let live = self.arena.bytes.len() - self.arena.dead;
        let mut bytes = Vec::with_capacity(live);
        for slot in self.table.iter_mut() {
            let start = bytes.len();
            bytes.extend_from_slice(self.arena.get(slot.start, slot.len));
            // Fits: the live bytes fitted before.
            slot.start = u32::try_from(start).unwrap_or(u32::MAX);
        }
        self.arena = Arena { bytes, dead: 0 };
    }

    /// Bytes held on the heap (the table's slots and the arena), for tests of memory bounds.
    pub fn heap_bytes(&self) -> usize {
        self.table.allocation_size() + self.arena.bytes.capacity()
    }
}

/// A set of ids: an [`IdMap`] without values.
///
/// ```
/// use stepguard_jsonl::IdSet;
///
/// let mut seen = IdSet::new();
/// assert!(seen.insert(b"toolu_1"));
/// assert!(!seen.insert(b"toolu_1"));
/// assert!(seen.contains(b"toolu_1"));
/// assert!(seen.remove(b"toolu_1") && seen.is_empty());
/// ```
#[derive(Clone)]
pub struct IdSet<S = FxBuildHasher>(IdMap<(), S>);

impl<S> std::fmt::Debug for IdSet<S> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_tuple("IdSet").field(&self.0).finish()
    }
}

impl IdSet {
    /// Creates an empty set.
    pub fn new() -> Self {
        IdSet(IdMap::new())
    }
}

impl Default for IdSet {
    fn default() -> Self {
        Self::new()
    }
}

impl<S: BuildHasher> IdSet<S> {
    /// Creates an empty set hashing with `hasher`.
    pub fn with_hasher(hasher: S) -> Self {
        IdSet(IdMap::with_hasher(hasher))
    }

    /// Adds `id`; true when it was not there.
    pub fn insert(&mut self, id: &[u8]) -> bool {
        if self.0.contains(id) {
            return false;
        }
        self.0.insert(id, ());
        true
    }

    /// True when `id` is held.
    pub fn contains(&self, id: &[u8]) -> bool {
        self.0.contains(id)
    }

    /// Removes `id`; true when it was there.
    pub fn remove(&mut self, id: &[u8]) -> bool {
        self.0.remove(id).is_some()
    }

    /// The number of ids held.
    pub fn len(&self) -> usize {
        self.0.len()
    }

    /// True when no id is held.
    pub fn is_empty(&self) -> bool {
        self.0.is_empty()
    }

    /// Bytes held on the heap.
    pub fn heap_bytes(&self) -> usize {
        self.0.heap_bytes()
    }
}

#[cfg(test)]
mod tests {
    use std::hash::{BuildHasherDefault, Hasher};

    use proptest::prelude::*;

    use super::*;

    /// Hashes every id to the same value: every lookup goes through the collision path.
    #[derive(Default)]
    struct Colliding;

    impl Hasher for Colliding {
        fn finish(&self) -> u64 {
            42
        }
        fn write(&mut self, _: &[u8]) {}
    }

    type AllCollide = BuildHasherDefault<Colliding>;

    #[test]
    fn ids_whose_hashes_collide_stay_distinct() {
        let mut set = IdSet::with_hasher(AllCollide::default());
        for i in 0..200u32 {
            assert!(set.insert(format!("item_{i}").as_bytes()), "{i}");
        }
        for i in 0..200u32 {
            assert!(!set.insert(format!("item_{i}").as_bytes()), "{i} again");
        }
        assert_eq!(set.len(), 200);
        assert!(!set.contains(b"item_200"));
        // A prefix or an extension of a held id is another id.
        assert!(!set.contains(b"item_1\0") && !set.contains(b"item_"));
        assert!(set.remove(b"item_7") && !set.contains(b"item_7") && set.contains(b"item_17"));
        assert_eq!(set.len(), 199);
    }

    #[test]
    fn colliding_map_values_belong_to_their_own_id() {
        let mut map = IdMap::with_hasher(AllCollide::default());
        map.insert(b"a", 1);
        map.insert(b"b", 2);
        assert_eq!(map.insert(b"a", 3), Some(1));
        assert_eq!((map.get(b"a"), map.get(b"b")), (Some(&3), Some(&2)));
        assert_eq!(map.remove(b"b"), Some(2));
        assert_eq!((map.get(b"a"), map.get(b"b")), (Some(&3), None));
    }

    #[test]
    fn memory_follows_the_ids_held_not_the_ids_ever_seen() {
        let mut set = IdSet::new();
        // A long stream of items, each opened then closed, ten open at a time.
        for i in 0..1_000_000u64 {
            assert!(set.insert(format!("item_{i}").as_bytes()));
            if i >= 10 {
                assert!(set.remove(format!("item_{}", i - 10).as_bytes()));
            }
        }
        assert_eq!(set.len(), 10);
        assert!(set.contains(b"item_999999") && !set.contains(b"item_5"));
        assert!(set.heap_bytes() < 64 << 10, "{} bytes", set.heap_bytes());
    }

    #[test]
    fn an_id_seen_again_after_a_long_gap_is_still_known() {
        let mut set = IdSet::new();
        assert!(set.insert(b"msg_first"));
        for i in 0..300_000u32 {
            set.insert(format!("msg_{i:024x}").as_bytes());
            if i % 3 == 0 {
                set.remove(format!("msg_{i:024x}").as_bytes());
            }
        }
        assert!(!set.insert(b"msg_first"));
        assert!(set.contains(format!("msg_{:024x}", 299_999).as_bytes()));
        assert!(!set.contains(format!("msg_{:024x}", 299_997).as_bytes()));
    }

    proptest! {
        /// The map agrees with a std HashMap of owned keys, under any hasher, through inserts,
        /// removals and the compactions they cause.
        #[test]
        fn agrees_with_a_hashmap(
            ops in prop::collection::vec((0u8..3, prop::collection::vec(0u8..4, 0..4), any::<u8>()), 0..400),
            collide in any::<bool>(),
        ) {
            let mut model = std::collections::HashMap::new();
            let mut fx: IdMap<u8> = IdMap::new();
            let mut bad: IdMap<u8, AllCollide> = IdMap::with_hasher(AllCollide::default());
            for (op, id, value) in ops {
                // Long ids, so that removals reach the compaction threshold.
                let id = [id, vec![b'x'; 1000]].concat();
                match op {
                    0 => {
                        let want = model.insert(id.clone(), value);
                        if collide { prop_assert_eq!(bad.insert(&id, value), want); }
                        else { prop_assert_eq!(fx.insert(&id, value), want); }
                    }
                    1 => {
                        let want = model.remove(&id);
                        if collide { prop_assert_eq!(bad.remove(&id), want); }
                        else { prop_assert_eq!(fx.remove(&id), want); }
                    }
                    _ => {
                        let want = model.get(&id);
                        if collide { prop_assert_eq!(bad.get(&id), want); }
                        else { prop_assert_eq!(fx.get(&id), want); }
                    }
                }
                prop_assert_eq!(if collide { bad.len() } else { fx.len() }, model.len());
            }
        }
    }
}
