//! String lists shared by content ([`SharedLists`]): a lab's hosts carry a few distinct
//! label lists, so each host's record (the row's labels) and the allocator's view of it
//! (their name form) hold a pointer to one list, not strings of their own.

use std::{collections::BTreeMap, sync::Arc};

/// One shared list for each distinct key, made the first time the key is asked for. Lists
/// nobody else holds any more are dropped whenever the lists have doubled since the last
/// such sweep.
#[derive(Debug, Default)]
pub struct SharedLists {
    lists: BTreeMap<Box<[String]>, Arc<[String]>>,
    after_sweep: usize,
}

impl SharedLists {
    /// The list shared for `key`: `make(key)` the first time (or after a sweep dropped it).
    pub fn shared(
        &mut self,
        key: &[String],
        make: impl FnOnce(&[String]) -> Arc<[String]>,
    ) -> Arc<[String]> {
        if let Some(list) = self.lists.get(key) {
            return Arc::clone(list);
        }
        if self.lists.len() >= (2 * self.after_sweep).max(64) {
            self.lists.retain(|_, list| Arc::strong_count(list) > 1);
            self.after_sweep = self.lists.len();
        }
        let list = make(key);
        self.lists.insert(key.into(), Arc::clone(&list));
        list
    }

    /// How many lists are kept (held or not yet swept).
    pub fn len(&self) -> usize {
        self.lists.len()
    }

    /// Whether no list is kept.
    pub fn is_empty(&self) -> bool {
        self.lists.is_empty()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The lists nobody holds any more are dropped once the lists have doubled; those
    /// still held stay shared.
    #[test]
    fn lists_nobody_holds_are_swept() {
        let mut lists = SharedLists::default();
        let key = |l: &str| [l.to_string()];
        let kept = lists.shared(&key("linux"), |l| l.into());
        for i in 0..200 {
            lists.shared(&key(&format!("l{i}")), |l| l.into());
        }
        assert!(lists.len() < 100, "{} lists kept", lists.len());
        assert!(Arc::ptr_eq(
            &kept,
            &lists.shared(&key("linux"), |l| l.into())
        ));
    }
}
