use super::*;

fn entry() -> Cached {
    Cached {
        agent_id: Uuid::new_v4(),
        node_id: Uuid::new_v4(),
    }
}

#[test]
fn nothing_is_trusted_before_the_revocation_log_was_read() {
    let cache = CredentialCache::new(Duration::from_secs(2));
    cache.insert([1; 32], entry(), Instant::now());
    assert!(cache.get(&[1; 32]).is_none());
    assert!(cache.is_empty());
}

#[test]
fn a_lookup_older_than_the_last_read_is_not_remembered() {
    let cache = CredentialCache::new(Duration::from_secs(2));
    let looked_up = Instant::now();
    // A read of the log started after the lookup: it may have forgotten a revocation the
    // lookup did not see yet, so what the lookup found is not kept.
    cache.mark_read(Instant::now());
    cache.insert([1; 32], entry(), looked_up);
    assert!(cache.get(&[1; 32]).is_none());
    let e = entry();
    cache.insert([2; 32], e, Instant::now());
    assert_eq!(cache.get(&[2; 32]), Some(e));
}

#[test]
fn a_stale_feed_sends_every_credential_to_the_database() {
    let delay = Duration::from_millis(50);
    let cache = CredentialCache::new(delay);
    cache.mark_read(Instant::now());
    let e = entry();
    cache.insert([3; 32], e, Instant::now());
    assert_eq!(cache.get(&[3; 32]), Some(e));
    std::thread::sleep(delay * 2);
    assert!(cache.get(&[3; 32]).is_none(), "trusted past the delay");
    // Fresh again: the entry (not revoked meanwhile) is trusted again.
    cache.mark_read(Instant::now());
    assert_eq!(cache.get(&[3; 32]), Some(e));
}

#[test]
fn forgetting_an_agent_or_a_node_drops_its_credentials_only() {
    let cache = CredentialCache::new(Duration::from_secs(2));
    cache.mark_read(Instant::now());
    let (a, b, c) = (entry(), entry(), entry());
    for (sha, e) in [([1; 32], a), ([2; 32], b), ([3; 32], c)] {
        cache.insert(sha, e, Instant::now());
    }
    cache.forget_agents(&[a.agent_id]);
    cache.forget_node(b.node_id);
    assert!(cache.get(&[1; 32]).is_none());
    assert!(cache.get(&[2; 32]).is_none());
    assert_eq!(cache.get(&[3; 32]), Some(c));
}

#[test]
fn a_zero_delay_disables_the_cache() {
    let cache = CredentialCache::new(Duration::ZERO);
    cache.mark_read(Instant::now());
    cache.insert([1; 32], entry(), Instant::now());
    assert!(cache.get(&[1; 32]).is_none());
}
