//! [`HostMap`]: the maps keyed by host name that every report looks up, kept in name order
//! like the `BTreeMap`s they replace, found by a hash.
//!
//! Why: at 10k hosts whose every report changes, the allocator and the host table look a
//! host's name up a dozen times a report. In a `BTreeMap<String, _>` each lookup compares
//! the name with ~14 others, each comparison a `memcmp` through a pointer to another heap
//! string: ~230 ns a lookup on this machine against ~25 ns for a hash map with `foldhash`
//! (10k names `load00000`…, random order, by hand), and `memcmp` was the broker's top
//! symbol (perf). With these maps the allocator's entry point takes a third fewer
//! instructions per changed report, and the core half the time per repeated one
//! (`rb-corecost`, BENCHMARKS.md "Host names found by a hash"). Iteration stays in name
//! order (status rows, traces, snapshots, the first host that passes a scan): the entries
//! are kept sorted, so adding a host not yet in the map costs a shift of those after it
//! (O(n): hosts join a lab rarely, replacing a host's value is O(1)).
//!
//! The names are kept as [`HostName`]s, inside the entries (up to 24 bytes): a lookup
//! that finds the entry compares the name there, where a `String` key sent it to another
//! heap object, cold at 10k hosts (a repeated report's lookups missed the cache ~11 times
//! with `String` keys and ~9 with these: the core's time a repeated report 0.79×,
//! BENCHMARKS.md, "… host names inside the maps' entries (session 35)").

use std::{borrow::Borrow, fmt, ops::Index};

use compact_str::CompactString;
use indexmap::IndexMap;

/// The hash used for host names: names come from the lab file and the broker's own
/// pilots, not from strangers, so the fast variant (no DoS resistance beyond its random
/// seed) is the one to take.
pub type NameHash = foldhash::fast::RandomState;

/// A host's name as a [`HostMap`] keeps it: up to 24 bytes inside the map's entry itself
/// (longer ones on the heap), so that a lookup compares the name it finds without a
/// trip to another heap object (at 10k hosts every such trip is a cache miss).
pub type HostName = CompactString;

/// The hosts of a [`HostMap`] and their values, in name order.
pub type Iter<'a, V> = indexmap::map::Iter<'a, HostName, V>;

/// A map from host name to `V`, iterated in name order, looked up by hash.
#[derive(Clone)]
pub struct HostMap<V> {
    entries: IndexMap<HostName, V, NameHash>,
}

impl<V> Default for HostMap<V> {
    fn default() -> Self {
        HostMap {
            entries: IndexMap::default(),
        }
    }
}

impl<V: fmt::Debug> fmt::Debug for HostMap<V> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_map().entries(self.entries.iter()).finish()
    }
}

impl<V> HostMap<V> {
    pub fn new() -> Self {
        Self::default()
    }

    pub fn len(&self) -> usize {
        self.entries.len()
    }

    pub fn is_empty(&self) -> bool {
        self.entries.is_empty()
    }

    pub fn get<Q: ?Sized + Borrow<str>>(&self, host: &Q) -> Option<&V> {
        self.entries.get(host.borrow())
    }

    pub fn get_mut<Q: ?Sized + Borrow<str>>(&mut self, host: &Q) -> Option<&mut V> {
        self.entries.get_mut(host.borrow())
    }

    /// Where `host` is in name order (its row), if it is here; a host joining before it
    /// moves it on.
    pub fn index_of(&self, host: &str) -> Option<usize> {
        self.entries.get_index_of(host)
    }

    /// The value of the host at `index` in name order ([`Self::index_of`]).
    pub fn get_index(&self, index: usize) -> Option<&V> {
        self.entries.get_index(index).map(|(_, value)| value)
    }

    /// [`Self::get_index`], to change it.
    pub fn get_index_mut(&mut self, index: usize) -> Option<&mut V> {
        self.entries.get_index_mut(index).map(|(_, value)| value)
    }

    pub fn contains_key<Q: ?Sized + Borrow<str>>(&self, host: &Q) -> bool {
        self.entries.contains_key(host.borrow())
    }

    /// Sets `host`'s value, returning the one it replaces; a new host takes its place in
    /// name order.
    pub fn insert(&mut self, host: impl Into<HostName>, value: V) -> Option<V> {
        let host = host.into();
        if let Some(slot) = self.entries.get_mut(host.as_str()) {
            return Some(std::mem::replace(slot, value));
        }
        self.entries.insert_sorted(host, value).1
    }

    /// Takes `host` out, keeping the others in order.
    pub fn remove<Q: ?Sized + Borrow<str>>(&mut self, host: &Q) -> Option<V> {
        self.entries.shift_remove(host.borrow())
    }

    /// The hosts and their values, in name order.
    pub fn iter(&self) -> Iter<'_, V> {
        self.entries.iter()
    }

    /// [`Self::iter`] from the `from`th host in name order on (none when `from` is past
    /// the last).
    pub fn iter_from(&self, from: usize) -> Iter<'_, V> {
        self.entries.get_range(from..).unwrap_or_default().iter()
    }

    /// Where `host` is or would be in name order: the number of hosts before it.
    pub fn position_of(&self, host: &str) -> usize {
        self.entries.partition_point(|name, _| name.as_str() < host)
    }

    pub fn keys(&self) -> indexmap::map::Keys<'_, HostName, V> {
        self.entries.keys()
    }

    pub fn values(&self) -> indexmap::map::Values<'_, HostName, V> {
        self.entries.values()
    }
}

impl<V, Q: ?Sized + Borrow<str>> Index<&Q> for HostMap<V> {
    type Output = V;

    /// The value of a host known to be in the map (panics otherwise, like `BTreeMap`'s).
    fn index(&self, host: &Q) -> &V {
        let host = host.borrow();
        match self.entries.get(host) {
            Some(value) => value,
            None => panic!("host {host:?} not in the map"),
        }
    }
}

/// Collected in any order, kept in name order (a name given twice keeps its last value).
impl<K: Into<HostName>, V> FromIterator<(K, V)> for HostMap<V> {
    fn from_iter<I: IntoIterator<Item = (K, V)>>(iter: I) -> Self {
        let mut entries: IndexMap<HostName, V, NameHash> = iter
            .into_iter()
            .map(|(name, value)| (name.into(), value))
            .collect();
        entries.sort_unstable_keys();
        HostMap { entries }
    }
}

impl<'a, V> IntoIterator for &'a HostMap<V> {
    type Item = (&'a HostName, &'a V);
    type IntoIter = Iter<'a, V>;

    fn into_iter(self) -> Self::IntoIter {
        self.entries.iter()
    }
}

impl<'a, V> IntoIterator for &'a mut HostMap<V> {
    type Item = (&'a HostName, &'a mut V);
    type IntoIter = indexmap::map::IterMut<'a, HostName, V>;

    fn into_iter(self) -> Self::IntoIter {
        self.entries.iter_mut()
    }
}

#[cfg(test)]
mod tests {
    use std::collections::BTreeMap;

    use super::*;

    /// Any sequence of inserts, replacements and removals leaves the map as a `BTreeMap`
    /// given the same sequence: the same hosts, values and order.
    #[test]
    fn it_keeps_what_and_in_which_order_a_btreemap_keeps() {
        let mut map = HostMap::new();
        let mut model = BTreeMap::new();
        let mut seed = 0x9e37_79b9_7f4a_7c15u64;
        for step in 0..5_000u32 {
            seed ^= seed << 13;
            seed ^= seed >> 7;
            seed ^= seed << 17;
            let host = format!("h{:03}", seed % 300);
            match seed % 5 {
                0 | 1 => assert_eq!(map.insert(host.clone(), step), model.insert(host, step)),
                2 => assert_eq!(map.remove(&host), model.remove(&host)),
                3 => {
                    if let Some(value) = map.get_mut(&host) {
                        *value += 1;
                    }
                    if let Some(value) = model.get_mut(&host) {
                        *value += 1;
                    }
                }
                _ => assert_eq!(map.get(&host), model.get(&host)),
            }
        }
        assert!(map.len() > 50, "the walk left hosts in the map");
        let as_str = |(h, v): (&String, &u32)| (h.to_string(), *v);
        let in_map = |(h, v): (&HostName, &u32)| (h.to_string(), *v);
        assert!(
            map.iter().map(in_map).eq(model.iter().map(as_str)),
            "same hosts, values and order"
        );
        let collected: HostMap<u32> = model.clone().into_iter().rev().collect();
        assert!(
            collected.iter().map(in_map).eq(model.iter().map(as_str)),
            "collected in name order"
        );
        assert!(collected.iter().eq(map.iter()));
    }
}
