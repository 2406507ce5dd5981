//! The agent's side of the subagents' JEL relay: which connection of the job's
//! pool (`jel::pool::ConnId`) is which subagent's connection, and back. Pure: the shell tells
//! it what opened, closed and was lost, and asks it where to send what.
//!
//! # Model
//! - A **route** ties a pool connection to `(subagent link, the subagent's connection id)`.
//! - A subagent link that is **lost** leaves its connections **orphaned** under their
//!   allocation: the subagent closed them on its host when it lost the link
//!   ([`crate::subjel`]), but whether its processes still run is not known until its own
//!   deadline for ending them has passed. They are closed in the pool when a subagent of the
//!   allocation attaches again (the link came back: its members were closed there), or when
//!   that deadline passes ([`Routes::take_orphans`]: `died{host_lost}` when the host has no
//!   subagent left, else a plain close).

use std::collections::{BTreeMap, HashMap};

use jel::pool::ConnId;

use crate::core::{AllocId, SubId};

/// A subagent's id for one of its JEL connections.
pub type LocalConn = u64;

/// Where a pool connection's lines go.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Route {
    pub sub: SubId,
    pub conn: LocalConn,
}

/// The routing table.
#[derive(Debug, Default)]
pub struct Routes {
    by_local: HashMap<(SubId, LocalConn), ConnId>,
    by_pool: HashMap<ConnId, Route>,
    /// The allocation of each live subagent link with connections.
    alloc_of: HashMap<SubId, AllocId>,
    /// Connections of lost links, by allocation (see the module doc).
    orphans: BTreeMap<AllocId, Vec<ConnId>>,
}

impl Routes {
    /// Subagent `sub` of `alloc` opened `conn`, which the pool knows as `pool`. A second open
    /// of the same `conn` replaces the first: the old pool connection is returned, to close.
    pub fn opened(
        &mut self,
        alloc: AllocId,
        sub: SubId,
        conn: LocalConn,
        pool: ConnId,
    ) -> Option<ConnId> {
        self.alloc_of.insert(sub, alloc);
        let old = self.by_local.insert((sub, conn), pool);
        if let Some(old) = old {
            self.by_pool.remove(&old);
        }
        self.by_pool.insert(pool, Route { sub, conn });
        old
    }

    /// The pool connection of `sub`'s `conn`.
    pub fn pool_conn(&self, sub: SubId, conn: LocalConn) -> Option<ConnId> {
        self.by_local.get(&(sub, conn)).copied()
    }

    /// `sub`'s `conn` closed: the pool connection to close, if it was known.
    pub fn closed(&mut self, sub: SubId, conn: LocalConn) -> Option<ConnId> {
        let pool = self.by_local.remove(&(sub, conn))?;
        self.by_pool.remove(&pool);
        Some(pool)
    }

    /// Where the pool's lines for `pool` go.
    pub fn route(&self, pool: ConnId) -> Option<Route> {
        self.by_pool.get(&pool).copied()
    }

    /// The pool closed `pool` (or the shell cut it off): forgotten; where to say so, if its
    /// link is live.
    pub fn disconnect(&mut self, pool: ConnId) -> Option<Route> {
        for conns in self.orphans.values_mut() {
            conns.retain(|c| *c != pool);
        }
        self.orphans.retain(|_, conns| !conns.is_empty());
        let route = self.by_pool.remove(&pool)?;
        self.by_local.remove(&(route.sub, route.conn));
        Some(route)
    }

    /// The link of `sub` is lost: its connections become orphans of its allocation.
    pub fn sub_gone(&mut self, sub: SubId) {
        let Some(alloc) = self.alloc_of.remove(&sub) else {
            return;
        };
        let mut gone: Vec<(LocalConn, ConnId)> = self
            .by_local
            .iter()
            .filter(|((s, _), _)| *s == sub)
            .map(|((_, c), p)| (*c, *p))
            .collect();
        gone.sort_unstable();
        for (conn, pool) in gone {
            self.by_local.remove(&(sub, conn));
            self.by_pool.remove(&pool);
            self.orphans.entry(alloc).or_default().push(pool);
        }
    }

    /// The orphans of `alloc`, forgotten: the pool connections to end (see the module doc).
    pub fn take_orphans(&mut self, alloc: AllocId) -> Vec<ConnId> {
        self.orphans.remove(&alloc).unwrap_or_default()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn lines_go_both_ways_until_either_side_closes() {
        let mut r = Routes::default();
        assert_eq!(r.opened(5, 10, 1, 100), None);
        assert_eq!(r.opened(5, 11, 1, 101), None, "another subagent's conn 1");
        assert_eq!(r.pool_conn(10, 1), Some(100));
        assert_eq!(r.pool_conn(11, 1), Some(101));
        assert_eq!(r.route(101), Some(Route { sub: 11, conn: 1 }));
        assert_eq!(r.closed(10, 1), Some(100));
        assert_eq!((r.pool_conn(10, 1), r.route(100)), (None, None));
        assert_eq!(r.closed(10, 1), None, "closed once");
        assert_eq!(r.disconnect(101), Some(Route { sub: 11, conn: 1 }));
        assert_eq!((r.pool_conn(11, 1), r.disconnect(101)), (None, None));
    }

    #[test]
    fn a_reopened_local_conn_replaces_the_old_pool_conn() {
        let mut r = Routes::default();
        r.opened(5, 10, 1, 100);
        assert_eq!(r.opened(5, 10, 1, 200), Some(100));
        assert_eq!(r.route(100), None);
        assert_eq!(r.pool_conn(10, 1), Some(200));
    }

    #[test]
    fn a_lost_link_orphans_its_conns_under_their_allocation_until_taken() {
        let mut r = Routes::default();
        r.opened(5, 10, 1, 100);
        r.opened(5, 10, 2, 101);
        r.opened(6, 11, 1, 102);
        r.sub_gone(10);
        assert_eq!((r.route(100), r.pool_conn(10, 2)), (None, None));
        assert_eq!(
            r.route(102),
            Some(Route { sub: 11, conn: 1 }),
            "others stay"
        );
        // The pool ends one itself (the host was released): no longer an orphan.
        assert_eq!(r.disconnect(101), None);
        assert_eq!(r.take_orphans(6), Vec::<ConnId>::new());
        assert_eq!(r.take_orphans(5), vec![100]);
        assert_eq!(r.take_orphans(5), Vec::<ConnId>::new(), "taken once");
        r.sub_gone(10);
        r.sub_gone(99);
        assert_eq!(r.take_orphans(5), Vec::<ConnId>::new());
    }
}
