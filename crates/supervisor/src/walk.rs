//! Finding a tree's processes by walking `/proc`: descendants by parent pid, with their process
//! groups, where a zombie whose threads still run counts as alive.

use std::collections::HashMap;

/// One live process found in `/proc`.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) struct Proc {
    pub pid: u32,
    pub pgid: u32,
}

/// One line of `/proc/PID/stat`: (pid, state, ppid, pgid). The command name may hold spaces and
/// parentheses, so the fields are read after the last `)`.
pub(crate) fn parse_stat(stat: &str) -> Option<(u32, char, u32, u32)> {
    let pid = stat.split_whitespace().next()?.parse().ok()?;
    let rest = &stat[stat.rfind(')')? + 1..];
    let mut fields = rest.split_whitespace();
    let state = fields.next()?.chars().next()?;
    let ppid = fields.next()?.parse().ok()?;
    let pgid = fields.next()?.parse().ok()?;
    Some((pid, state, ppid, pgid))
}

/// Returns true when a process in `state` is alive. A zombie thread-group leader whose other
/// threads still run (`pthread_exit` in `main`) is alive: signals to its pid still reach them.
pub(crate) fn is_alive(pid: u32, state: char) -> bool {
    if state != 'Z' && state != 'X' {
        return true;
    }
    let Ok(tasks) = std::fs::read_dir(format!("/proc/{pid}/task")) else {
        return false;
    };
    tasks.flatten().any(|task| {
        std::fs::read_to_string(task.path().join("stat"))
            .ok()
            .and_then(|s| parse_stat(&s))
            .is_some_and(|(_, state, _, _)| state != 'Z' && state != 'X')
    })
}

/// Every live descendant of a root, and the process groups of everyone else.
#[derive(Debug, Default)]
pub(crate) struct Scan {
    pub descendants: Vec<Proc>,
    /// Groups of every descendant seen, zombies included (a PID hopper's generations are
    /// zombies of the supervisor long enough to be seen, while its live one rarely is).
    pub groups: std::collections::HashSet<u32>,
    /// Groups with a live member that is not a descendant: never signalled as a group (a
    /// descendant may join a group of its session, e.g. the user's shell's).
    pub foreign_groups: std::collections::HashSet<u32>,
}

/// Returns every live descendant of `root`, with its process group.
pub(crate) fn scan(root: u32) -> Vec<Proc> {
    scan_all(root).descendants
}

/// Walks `/proc` once: the descendants of `root` and the groups of all other processes.
pub(crate) fn scan_all(root: u32) -> Scan {
    let Ok(entries) = std::fs::read_dir("/proc") else {
        return Scan::default();
    };
    let mut children: HashMap<u32, Vec<(Proc, char)>> = HashMap::new();
    for entry in entries.flatten() {
        let name = entry.file_name();
        let Some(name) = name
            .to_str()
            .filter(|n| n.bytes().all(|b| b.is_ascii_digit()))
        else {
            continue;
        };
        let Ok(stat) = std::fs::read_to_string(format!("/proc/{name}/stat")) else {
            continue;
        };
        if let Some((pid, state, ppid, pgid)) = parse_stat(&stat) {
            // Whether a zombie's threads run is asked only of descendants (below): reading
            // every zombie's task list would make one scan slow on a machine full of them.
            children
                .entry(ppid)
                .or_default()
                .push((Proc { pid, pgid }, state));
        }
    }
    let mut out = Vec::new();
    let mut stack = vec![root];
    let mut seen = std::collections::HashSet::new();
    let mut groups = std::collections::HashSet::new();
    while let Some(p) = stack.pop() {
        for &(child, state) in children.get(&p).map(Vec::as_slice).unwrap_or_default() {
            if is_alive(child.pid, state) {
                out.push(child);
            }
            groups.insert(child.pgid);
            seen.insert(child.pid);
            stack.push(child.pid);
        }
    }
    let foreign_groups = children
        .values()
        .flatten()
        .filter(|(p, state)| *state != 'Z' && *state != 'X' && !seen.contains(&p.pid))
        .map(|(p, _)| p.pgid)
        .collect();
    Scan {
        descendants: out,
        groups,
        foreign_groups,
    }
}

/// The live children of this process, read from `/proc/self/task/*/children` (a child is on the
/// list of the thread that made it, an orphan on that of the thread it was given to): small
/// reads, so a PID hopper, which is this subreaper's child nearly all the time, is seen however
/// fast its pid changes. A generation read alive may be a zombie by the time its state is read,
/// its successor given to this process just after the read: so the lists are read again until
/// they show a live child or stay the same twice. `None` when the kernel has no such lists.
pub(crate) fn live_children() -> Option<Vec<u32>> {
    let mut last: Option<Vec<u32>> = None;
    for _ in 0..CHILDREN_READS {
        let listed = children_lists()?;
        let live: Vec<u32> = listed
            .iter()
            .copied()
            .filter(|&pid| {
                // Zombies stay listed until the reaper takes them; one whose threads run lives.
                std::fs::read_to_string(format!("/proc/{pid}/stat"))
                    .ok()
                    .and_then(|s| parse_stat(&s))
                    .is_some_and(|(_, state, _, _)| is_alive(pid, state))
            })
            .collect();
        if !live.is_empty() || last.as_ref() == Some(&listed) {
            return Some(live);
        }
        last = Some(listed);
    }
    // The lists never settled: children keep coming and going. Report them (dead ones are
    // harmless to signal) rather than claim there are none.
    last
}

/// How often [`live_children`] reads the lists before it stops waiting for them to settle.
const CHILDREN_READS: usize = 16;

/// Every pid on this process's children lists, sorted; `None` when there are no such lists.
fn children_lists() -> Option<Vec<u32>> {
    let tasks = std::fs::read_dir("/proc/self/task").ok()?;
    let mut found = false;
    let mut kids = Vec::new();
    for task in tasks.flatten() {
        let Ok(list) = std::fs::read_to_string(task.path().join("children")) else {
            continue;
        };
        found = true;
        kids.extend(
            list.split_whitespace()
                .filter_map(|p| p.parse::<u32>().ok()),
        );
    }
    kids.sort_unstable();
    found.then_some(kids)
}

/// When `pid` started, in clock ticks since boot (`/proc/PID/stat` field 22).
pub(crate) fn start_time(pid: u32) -> Option<u64> {
    let stat = std::fs::read_to_string(format!("/proc/{pid}/stat")).ok()?;
    stat[stat.rfind(')')? + 1..]
        .split_whitespace()
        .nth(19)?
        .parse()
        .ok()
}

/// The live members of process group `pgid` (this process left out), split into those that
/// started at or after `since` (clock ticks since boot) and how many started before.
pub(crate) fn group_members(pgid: u32, since: u64) -> (Vec<u32>, usize) {
    let Ok(entries) = std::fs::read_dir("/proc") else {
        return (Vec::new(), 0);
    };
    let me = std::process::id();
    let (mut late, mut early) = (Vec::new(), 0);
    for entry in entries.flatten() {
        let Some(pid) = entry
            .file_name()
            .to_str()
            .and_then(|n| n.parse::<u32>().ok())
        else {
            continue;
        };
        let Ok(stat) = std::fs::read_to_string(format!("/proc/{pid}/stat")) else {
            continue;
        };
        let Some((_, state, _, group)) = parse_stat(&stat) else {
            continue;
        };
        if group != pgid || pid == me || !is_alive(pid, state) {
            continue;
        }
        match start_time(pid) {
            Some(t) if t >= since => late.push(pid),
            _ => early += 1,
        }
    }
    (late, early)
}

/// Returns the process group of `pid`, when it lives.
pub(crate) fn pgid_of(pid: u32) -> Option<u32> {
    std::fs::read_to_string(format!("/proc/{pid}/stat"))
        .ok()
        .and_then(|s| parse_stat(&s))
        .map(|(_, _, _, pgid)| pgid)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn group_members_are_split_by_when_they_started() {
        use std::os::unix::process::CommandExt as _;
        let mut child = std::process::Command::new("sleep")
            .arg("5")
            .process_group(0)
            .spawn()
            .unwrap();
        let pid = child.id();
        let started = start_time(pid).unwrap();
        assert!(started >= start_time(std::process::id()).unwrap());
        assert_eq!(group_members(pid, started), (vec![pid], 0));
        assert_eq!(group_members(pid, started + 1), (Vec::new(), 1));
        let _ = child.kill();
        let _ = child.wait();
        assert_eq!(group_members(pid, 0), (Vec::new(), 0));
    }

    #[test]
    fn stat_lines_with_odd_command_names() {
        assert_eq!(parse_stat("42 (sleep) S 7 42 42 0"), Some((42, 'S', 7, 42)));
        assert_eq!(parse_stat("43 (a) b (c) Z 9 1 1"), Some((43, 'Z', 9, 1)));
        assert_eq!(parse_stat("garbage"), None);
    }

    #[test]
    fn a_child_is_on_the_list_while_it_lives() {
        let mut child = std::process::Command::new("sleep")
            .arg("30")
            .spawn()
            .unwrap();
        let pid = child.id();
        assert!(live_children().unwrap().contains(&pid));
        child.kill().unwrap();
        // A zombie not yet reaped is not alive.
        while std::fs::read_to_string(format!("/proc/{pid}/stat"))
            .ok()
            .and_then(|s| parse_stat(&s))
            .is_some_and(|(_, state, _, _)| state != 'Z')
        {
            std::thread::sleep(std::time::Duration::from_millis(1));
        }
        assert!(!live_children().unwrap().contains(&pid));
        child.wait().unwrap();
    }

    #[test]
    fn this_process_is_alive_and_a_missing_one_is_not() {
        assert!(is_alive(std::process::id(), 'S'));
        assert!(!is_alive(u32::MAX, 'Z'));
    }
}
