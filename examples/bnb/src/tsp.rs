//! The travelling-salesman problem rb-bnb solves: a seeded random instance, the split of
//! the search tree into subtrees (tasks: fixed tour prefixes), a depth-first branch and bound
//! over one subtree under a shared upper bound, and the exhaustive search that checks it.
//!
//! Pure and deterministic: the same cities and seed give the same instance on every host,
//! so a task travels as its prefix alone.

/// Most cities an instance may have (the search keeps the visited set in a `u32`).
pub const MAX_CITIES: usize = 24;
/// Most cities the exhaustive search is asked to try ((n-1)! tours).
pub const MAX_BRUTE_FORCE: usize = 11;

/// Cities on a 1000 × 1000 grid; distances are Euclidean, rounded to integers.
#[derive(Debug, Clone)]
pub struct Instance {
    n: usize,
    dist: Vec<u64>,
    /// The shortest edge out of each city: the search's lower bound.
    min_out: Vec<u64>,
}

/// A tour and its cost (the tour starts at city 0; the edge back to 0 is implied).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Tour {
    pub cost: u64,
    pub cities: Vec<usize>,
}

/// SplitMix64: a tiny, well-known generator, so that every host derives the same cities.
fn splitmix(state: &mut u64) -> u64 {
    *state = state.wrapping_add(0x9E37_79B9_7F4A_7C15);
    let mut z = *state;
    z = (z ^ (z >> 30)).wrapping_mul(0xBF58_476D_1CE4_E5B9);
    z = (z ^ (z >> 27)).wrapping_mul(0x94D0_49BB_1331_11EB);
    z ^ (z >> 31)
}

impl Instance {
    /// `cities` random cities from `seed` (2 ≤ cities ≤ [`MAX_CITIES`]).
    pub fn random(cities: usize, seed: u64) -> Instance {
        let mut state = seed;
        let points: Vec<(i64, i64)> = (0..cities)
            .map(|_| {
                let x = (splitmix(&mut state) % 1000) as i64;
                let y = (splitmix(&mut state) % 1000) as i64;
                (x, y)
            })
            .collect();
        let mut dist = vec![0; cities * cities];
        for (a, &(xa, ya)) in points.iter().enumerate() {
            for (b, &(xb, yb)) in points.iter().enumerate() {
                let d2 = ((xa - xb).pow(2) + (ya - yb).pow(2)) as f64;
                dist[a * cities + b] = d2.sqrt().round() as u64;
            }
        }
        let min_out = (0..cities)
            .map(|a| {
                (0..cities)
                    .filter(|&b| b != a)
                    .map(|b| dist[a * cities + b])
                    .min()
                    .unwrap_or(0)
            })
            .collect();
        Instance {
            n: cities,
            dist,
            min_out,
        }
    }

    pub fn cities(&self) -> usize {
        self.n
    }

    fn d(&self, a: usize, b: usize) -> u64 {
        self.dist[a * self.n + b]
    }

    /// The cost of the closed tour through `cities` in order.
    pub fn cost(&self, cities: &[usize]) -> u64 {
        let legs = cities.windows(2).map(|w| self.d(w[0], w[1])).sum::<u64>();
        let back = match (cities.first(), cities.last()) {
            (Some(&first), Some(&last)) => self.d(last, first),
            _ => 0,
        };
        legs + back
    }

    /// Nearest neighbour from city 0: the first upper bound.
    pub fn greedy(&self) -> Tour {
        let mut tour = vec![0];
        let mut seen = 1u32;
        while tour.len() < self.n {
            let last = tour[tour.len() - 1];
            let next = (0..self.n)
                .filter(|c| seen & (1 << c) == 0)
                .min_by_key(|&c| self.d(last, c))
                .unwrap_or(0);
            seen |= 1 << next;
            tour.push(next);
        }
        Tour {
            cost: self.cost(&tour),
            cities: tour,
        }
    }

    /// The tasks: every tour prefix of `1 + depth` distinct cities starting at city 0
    /// (`depth` is capped at `cities - 1`), in lexicographic order. Their subtrees cover
    /// every tour exactly once.
    pub fn tasks(&self, depth: usize) -> Vec<Vec<usize>> {
        let len = (1 + depth).min(self.n);
        let mut out = Vec::new();
        let mut prefix = vec![0];
        self.extend_prefixes(&mut prefix, 1, len, &mut out);
        out
    }

    fn extend_prefixes(
        &self,
        prefix: &mut Vec<usize>,
        seen: u32,
        len: usize,
        out: &mut Vec<Vec<usize>>,
    ) {
        if prefix.len() == len {
            out.push(prefix.clone());
            return;
        }
        for c in 1..self.n {
            if seen & (1 << c) == 0 {
                prefix.push(c);
                self.extend_prefixes(prefix, seen | (1 << c), len, out);
                prefix.pop();
            }
        }
    }

    /// The best tour in the subtree of `prefix` that costs less than `bound()` (read again
    /// at each node: other workers lower it), or `None`. `better` hears each improvement as
    /// it is found, so that it can be shared at once.
    pub fn search(
        &self,
        prefix: &[usize],
        bound: &dyn Fn() -> u64,
        better: &mut dyn FnMut(&Tour),
    ) -> Option<Tour> {
        let seen = prefix.iter().fold(0u32, |s, &c| s | (1 << c));
        let cost = prefix.windows(2).map(|w| self.d(w[0], w[1])).sum();
        let mut search = Search {
            inst: self,
            bound,
            better,
            path: prefix.to_vec(),
            best: None,
        };
        search.dfs(seen, cost);
        search.best
    }

    /// Every tour, tried: the check of [`Instance::search`] (cities ≤ [`MAX_BRUTE_FORCE`]).
    pub fn brute_force(&self) -> Tour {
        let mut rest: Vec<usize> = (1..self.n).collect();
        let mut best = Tour {
            cost: u64::MAX,
            cities: Vec::new(),
        };
        permute(&mut rest, 0, &mut |perm| {
            let mut tour = vec![0];
            tour.extend_from_slice(perm);
            let cost = self.cost(&tour);
            if cost < best.cost {
                best = Tour { cost, cities: tour };
            }
        });
        best
    }
}

/// Heap's algorithm would do; plain recursive swapping is clearer.
fn permute(items: &mut [usize], k: usize, visit: &mut dyn FnMut(&[usize])) {
    if k == items.len() {
        visit(items);
        return;
    }
    for i in k..items.len() {
        items.swap(k, i);
        permute(items, k + 1, visit);
        items.swap(k, i);
    }
}

/// One subtree's depth-first search.
struct Search<'a> {
    inst: &'a Instance,
    bound: &'a dyn Fn() -> u64,
    better: &'a mut dyn FnMut(&Tour),
    path: Vec<usize>,
    best: Option<Tour>,
}

impl Search<'_> {
    /// The best cost known: ours or the shared bound, whichever is lower.
    fn limit(&self) -> u64 {
        let ours = self.best.as_ref().map_or(u64::MAX, |t| t.cost);
        ours.min((self.bound)())
    }

    fn dfs(&mut self, seen: u32, cost: u64) {
        let n = self.inst.n;
        let last = self.path[self.path.len() - 1];
        if self.path.len() == n {
            let total = cost + self.inst.d(last, self.path[0]);
            if total < self.limit() {
                let tour = Tour {
                    cost: total,
                    cities: self.path.clone(),
                };
                (self.better)(&tour);
                self.best = Some(tour);
            }
            return;
        }
        // Every city still to visit is left once, and so is the last one: a lower bound.
        let rest: u64 = (0..n)
            .filter(|c| seen & (1 << c) == 0)
            .map(|c| self.inst.min_out[c])
            .sum();
        if cost + rest + self.inst.min_out[last] >= self.limit() {
            return;
        }
        for c in 1..n {
            if seen & (1 << c) == 0 {
                self.path.push(c);
                self.dfs(seen | (1 << c), cost + self.inst.d(last, c));
                self.path.pop();
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn solve_by_tasks(inst: &Instance, depth: usize) -> u64 {
        let start = inst.greedy().cost + 1;
        let best = std::cell::Cell::new(start);
        for task in inst.tasks(depth) {
            let found = inst.search(&task, &|| best.get(), &mut |t| {
                best.set(best.get().min(t.cost));
            });
            if let Some(t) = found {
                assert_eq!(inst.cost(&t.cities), t.cost, "a tour's cost is its own");
                best.set(best.get().min(t.cost));
            }
        }
        best.get().min(inst.greedy().cost)
    }

    #[test]
    fn branch_and_bound_finds_the_brute_force_optimum() {
        for cities in 3..=9 {
            for seed in 0..6 {
                let inst = Instance::random(cities, seed);
                let exact = inst.brute_force().cost;
                for depth in [0, 1, 2, 3] {
                    assert_eq!(
                        solve_by_tasks(&inst, depth),
                        exact,
                        "cities={cities} seed={seed} depth={depth}"
                    );
                }
            }
        }
    }

    #[test]
    fn tasks_cover_every_prefix_once() {
        let inst = Instance::random(6, 1);
        let tasks = inst.tasks(2);
        assert_eq!(tasks.len(), 5 * 4);
        let mut sorted = tasks.clone();
        sorted.dedup();
        assert_eq!(sorted.len(), tasks.len());
        assert!(tasks.iter().all(|t| t[0] == 0 && t.len() == 3));
        assert_eq!(inst.tasks(99).len(), 5 * 4 * 3 * 2, "depth is capped");
    }

    #[test]
    fn the_same_seed_gives_the_same_instance_and_another_differs() {
        let a = Instance::random(8, 42);
        assert_eq!(a.dist, Instance::random(8, 42).dist);
        assert_ne!(a.dist, Instance::random(8, 43).dist);
    }

    #[test]
    fn a_bound_below_the_optimum_prunes_everything() {
        let inst = Instance::random(7, 3);
        let exact = inst.brute_force().cost;
        let found = inst.search(&[0], &|| exact, &mut |_| {});
        assert_eq!(found, None, "nothing strictly below the optimum");
        let found = inst.search(&[0], &|| exact + 1, &mut |_| {});
        assert_eq!(found.map(|t| t.cost), Some(exact));
    }
}
