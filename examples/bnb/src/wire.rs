//! The master–worker protocol: one JSON object per line over TCP, each way. The master
//! hands out tasks (tour prefixes) with the best cost known, and tells everyone when it
//! drops; workers say who they are in the job's pool, share better tours as they find
//! them, and answer each task.
//!
//! ```text
//! worker → master  {"t":"hello","member":12,"launch":3,"pid":4242,"host":"node03"}
//!                  (member, launch, host null: the master's own worker)
//! master → worker  {"t":"task","id":3,"prefix":[0,4,2],"bound":4711}
//! worker → master  {"t":"better","cost":4650,"cities":[0,4,2,…]}
//! master → worker  {"t":"bound","cost":4650}
//! worker → master  {"t":"done","id":3,"best":{"cost":4650,"cities":[…]}}   (or "best":null)
//! master → worker  {"t":"quit"}
//! ```

use std::io::{self, BufRead, Read};

use serde::{Deserialize, Serialize};

/// Longest line either side reads (a tour of 24 cities is well under 1 KiB).
pub const MAX_LINE: u64 = 64 * 1024;

#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Found {
    pub cost: u64,
    pub cities: Vec<usize>,
}

/// Master → worker.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(tag = "t", rename_all = "snake_case")]
pub enum ToWorker {
    Task {
        id: usize,
        prefix: Vec<usize>,
        bound: u64,
    },
    Bound {
        cost: u64,
    },
    Quit,
}

/// Worker → master.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(tag = "t", rename_all = "snake_case")]
pub enum FromWorker {
    Hello {
        member: Option<u64>,
        launch: Option<u64>,
        /// The worker's pid and its host's lab name (as the pool has it), for the log.
        #[serde(default)]
        pid: u32,
        #[serde(default)]
        host: Option<String>,
    },
    Better {
        cost: u64,
        cities: Vec<usize>,
    },
    Done {
        id: usize,
        best: Option<Found>,
    },
}

/// One message as a line.
pub fn line<T: Serialize>(msg: &T) -> String {
    let mut s = serde_json::to_string(msg).unwrap_or_default();
    s.push('\n');
    s
}

/// Reads one message; `Ok(None)` at the end of the stream. A line over [`MAX_LINE`] or one
/// that does not parse is an error (the peer is not an rb-bnb of this version).
pub fn read<T: for<'de> Deserialize<'de>>(reader: &mut impl BufRead) -> io::Result<Option<T>> {
    let mut buf = Vec::new();
    let n = Read::take(&mut *reader, MAX_LINE + 1).read_until(b'\n', &mut buf)?;
    if n == 0 {
        return Ok(None);
    }
    if buf.last() != Some(&b'\n') && n as u64 > MAX_LINE {
        return Err(io::Error::new(io::ErrorKind::InvalidData, "line too long"));
    }
    serde_json::from_slice(&buf)
        .map(Some)
        .map_err(|e| io::Error::new(io::ErrorKind::InvalidData, e))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn messages_round_trip_as_documented() {
        let task = ToWorker::Task {
            id: 3,
            prefix: vec![0, 4, 2],
            bound: 4711,
        };
        assert_eq!(
            line(&task),
            "{\"t\":\"task\",\"id\":3,\"prefix\":[0,4,2],\"bound\":4711}\n"
        );
        let mut input = io::Cursor::new(line(&task) + &line(&ToWorker::Quit));
        assert_eq!(read::<ToWorker>(&mut input).expect("read"), Some(task));
        assert_eq!(
            read::<ToWorker>(&mut input).expect("read"),
            Some(ToWorker::Quit)
        );
        assert_eq!(read::<ToWorker>(&mut input).expect("read"), None);
    }

    #[test]
    fn garbage_and_endless_lines_are_errors_not_panics() {
        let mut input = io::Cursor::new(b"{\"t\":\"nope\"}\n".to_vec());
        assert!(read::<FromWorker>(&mut input).is_err());
        let mut endless = io::Cursor::new(vec![b'x'; (MAX_LINE + 10) as usize]);
        assert!(read::<FromWorker>(&mut endless).is_err());
    }
}
