//! Hosts coming and going: `vacate` on a reclaim, and the deaths when a host is released,
//! lost, or one of its processes killed.

use super::{
    state::{MemberRec, Pool},
    ConnId, DisconnectReason,
};
use crate::wire::{DeathReason, EventKind, Member, MemberId};

impl Pool {
    /// The members on granted host `host` (never the front end's: see
    /// [`Input::OpenedFrontEnd`](super::Input::OpenedFrontEnd)).
    fn on_host(&self, host: &str) -> Vec<Member> {
        let on = |r: &&MemberRec| r.member.host == host && !r.front_end;
        self.members
            .values()
            .filter(on)
            .map(|r| r.member.clone())
            .collect()
    }

    pub(super) fn reclaim(&mut self, host: String, deadline: u64) {
        self.vacating.insert(host.clone(), deadline);
        let members = self.on_host(&host);
        self.emit(EventKind::Vacate {
            host,
            members,
            deadline,
        });
    }

    /// The host left the job (`lost`: crashed and certainly dead; else released): its members
    /// die, its connections are cut.
    pub(super) fn host_gone(&mut self, host: &str, lost: bool) {
        let reason = match (lost, self.vacating.remove(host).is_some()) {
            (true, _) => DeathReason::HostLost,
            (false, true) => DeathReason::Vacated,
            (false, false) => DeathReason::Killed,
        };
        for member in self.on_host(host) {
            self.remove_member(member.id, Some(reason));
        }
        let mut conns: Vec<ConnId> = self
            .conns
            .iter()
            .filter(|(_, c)| c.host == host && !c.front_end)
            .map(|(id, _)| *id)
            .collect();
        conns.sort_unstable();
        for conn in conns {
            self.conns.remove(&conn);
            self.watchers.remove(&conn);
            self.outbox.remove(&conn);
            self.closing.push((conn, DisconnectReason::HostGone));
        }
        if !lost {
            self.emit(EventKind::HostReleased {
                host: host.to_string(),
            });
        }
    }

    pub(super) fn killed(&mut self, host: &str, pid: u32) {
        let hit = |m: &Member| m.host == host && m.pid == pid;
        let ids: Vec<MemberId> = self
            .on_host(host)
            .iter()
            .filter(|m| hit(m))
            .map(|m| m.id)
            .collect();
        for id in ids {
            self.remove_member(id, Some(DeathReason::Killed));
        }
    }
}
