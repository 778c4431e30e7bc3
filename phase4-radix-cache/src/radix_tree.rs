//! A radix tree over token ids whose edges own KV pages (SGLang's RadixAttention).
//!
//! Every root-to-node path spells a token prefix whose K/V is cached; each edge holds its
//! tokens and the pages with their K/V (a whole number of pages). Children are found by the
//! first page of their edge, so a lookup costs one hash probe and one comparison per edge.
//! Inserting a sequence that diverges in the middle of an edge splits it, so that shared
//! prefixes are stored once. Nodes carry a lock count (running requests use them), a
//! last-access time for least-recently-used eviction of unlocked leaves, and a count of the
//! requests that used them, for policies that weigh frequency instead.

use std::cmp::Reverse;
use std::collections::{BinaryHeap, HashMap};
use std::fmt;

use phase0::TokenId;
use phase1::{KvPool, PageId};

/// A node's index in the tree's arena.
pub type NodeId = usize;

const ROOT: NodeId = 0;

#[derive(Debug)]
struct Node {
    parent: NodeId,
    /// The edge from the parent: a whole number of pages of tokens.
    key: Vec<TokenId>,
    /// The pages holding the K/V of `key`, one per `page_size` tokens.
    pages: Vec<PageId>,
    /// Children by the first page of their key.
    children: HashMap<Box<[TokenId]>, NodeId>,
    /// Running requests whose matched prefix passes through this node.
    lock_ref: u32,
    last_access: u64,
    /// Requests that ever locked this node: how often its K/V was reused.
    uses: u64,
}

impl Node {
    fn new(parent: NodeId, key: Vec<TokenId>, pages: Vec<PageId>, now: u64) -> Self {
        Self {
            parent,
            key,
            pages,
            children: HashMap::new(),
            lock_ref: 0,
            last_access: now,
            uses: 0,
        }
    }
}

/// What an eviction policy may weigh about a leaf it could evict now.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct LeafInfo {
    pub node: NodeId,
    /// Pages on its edge: what evicting it can give back.
    pub num_pages: usize,
    /// The tree's clock at its last match or insert (larger is more recent).
    pub last_access: u64,
    /// Requests that reused its K/V (locked it), ever.
    pub uses: u64,
}

/// The longest cached prefix of a token sequence.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct MatchResult {
    /// Tokens matched, a multiple of the page size.
    pub num_tokens: usize,
    /// Their pages, in order.
    pub pages: Vec<PageId>,
    /// The node that ends the match (the root when nothing matched): lock it to keep the
    /// whole path from eviction.
    pub node: NodeId,
}

#[derive(Debug)]
pub struct RadixTree {
    page_size: usize,
    nodes: Vec<Option<Node>>,
    free_ids: Vec<NodeId>,
    clock: u64,
    pages_held: usize,
}

impl RadixTree {
    pub fn new(page_size: usize) -> Self {
        assert!(page_size > 0, "page_size must be at least 1");
        Self {
            page_size,
            nodes: vec![Some(Node::new(ROOT, Vec::new(), Vec::new(), 0))],
            free_ids: Vec::new(),
            clock: 0,
            pages_held: 0,
        }
    }

    pub fn page_size(&self) -> usize {
        self.page_size
    }

    pub fn root(&self) -> NodeId {
        ROOT
    }

    /// Nodes besides the root.
    pub fn num_nodes(&self) -> usize {
        self.nodes.iter().flatten().count() - 1
    }

    pub fn pages_held(&self) -> usize {
        self.pages_held
    }

    fn node(&self, id: NodeId) -> &Node {
        self.nodes[id].as_ref().expect("live node id")
    }

    fn node_mut(&mut self, id: NodeId) -> &mut Node {
        self.nodes[id].as_mut().expect("live node id")
    }

    fn tick(&mut self) -> u64 {
        self.clock += 1;
        self.clock
    }

    fn alloc(&mut self, node: Node) -> NodeId {
        match self.free_ids.pop() {
            Some(id) => {
                self.nodes[id] = Some(node);
                id
            }
            None => {
                self.nodes.push(Some(node));
                self.nodes.len() - 1
            }
        }
    }

    /// Whole pages at the start of `key` equal to the start of `tokens`.
    fn common_pages(&self, key: &[TokenId], tokens: &[TokenId]) -> usize {
        let ps = self.page_size;
        key.chunks_exact(ps)
            .zip(tokens.chunks_exact(ps))
            .take_while(|(a, b)| a == b)
            .count()
    }

    /// Cuts `child`'s edge after `pages` pages: a new node takes the first part and becomes
    /// `child`'s parent. Returns the new node. Locks carry over, since every request locking
    /// through `child` also passes through the new node.
    fn split(&mut self, child: NodeId, pages: usize) -> NodeId {
        let cut = pages * self.page_size;
        let parent = self.node(child).parent;
        let (upper_key, lower_key, upper_pages, lower_pages, lock_ref, last_access, uses) = {
            let c = self.node_mut(child);
            let lower_key = c.key.split_off(cut);
            let lower_pages = c.pages.split_off(pages);
            (
                std::mem::take(&mut c.key),
                lower_key,
                std::mem::take(&mut c.pages),
                lower_pages,
                c.lock_ref,
                c.last_access,
                c.uses,
            )
        };
        let first_lower: Box<[TokenId]> = lower_key[..self.page_size].into();
        let first_upper: Box<[TokenId]> = upper_key[..self.page_size].into();
        let mut upper = Node::new(parent, upper_key, upper_pages, last_access);
        upper.lock_ref = lock_ref;
        upper.uses = uses;
        let upper_id = self.alloc(upper);
        self.node_mut(upper_id).children.insert(first_lower, child);
        let c = self.node_mut(child);
        c.key = lower_key;
        c.pages = lower_pages;
        c.parent = upper_id;
        self.node_mut(parent).children.insert(first_upper, upper_id);
        upper_id
    }

    /// Finds the longest cached prefix of `tokens` in whole pages, splitting an edge if the
    /// match ends inside it, and marks the path as just used.
    pub fn match_prefix(&mut self, tokens: &[TokenId]) -> MatchResult {
        // BEGIN SOLUTION
        let ps = self.page_size;
        let now = self.tick();
        let mut node = ROOT;
        let mut pos = 0;
        let mut pages = Vec::new();
        while tokens.len() - pos >= ps {
            let Some(&child) = self.node(node).children.get(&tokens[pos..pos + ps]) else {
                break;
            };
            let matched = self.common_pages(&self.node(child).key, &tokens[pos..]);
            let edge_pages = self.node(child).pages.len();
            let child = if matched < edge_pages {
                self.split(child, matched)
            } else {
                child
            };
            let c = self.node_mut(child);
            c.last_access = now;
            pages.extend_from_slice(&c.pages);
            pos += matched * ps;
            node = child;
            if matched < edge_pages {
                break;
            }
        }
        MatchResult {
            num_tokens: pos,
            pages,
            node,
        }
        // END SOLUTION
    }

    /// Adds a computed sequence: `tokens` (whole pages) whose K/V is in `pages`. The part
    /// already in the tree is kept as it is; for the new part the tree takes a holder of the
    /// caller's pages. Returns how many tokens were new.
    pub fn insert(
        &mut self,
        pool: &mut KvPool,
        tokens: &[TokenId],
        pages: &[PageId],
    ) -> Result<usize, phase1::Error> {
        let ps = self.page_size;
        assert_eq!(
            tokens.len(),
            pages.len() * ps,
            "insert takes whole pages of tokens"
        );
        // BEGIN SOLUTION
        let now = self.tick();
        let mut node = ROOT;
        let mut pos = 0;
        while pos < tokens.len() {
            let first = &tokens[pos..pos + ps];
            let Some(&child) = self.node(node).children.get(first) else {
                // Nothing shares the rest: it becomes a new leaf owning its pages.
                let rest_pages = &pages[pos / ps..];
                for &p in rest_pages {
                    pool.share(p)?;
                }
                self.pages_held += rest_pages.len();
                let leaf = Node::new(node, tokens[pos..].to_vec(), rest_pages.to_vec(), now);
                let leaf_id = self.alloc(leaf);
                self.node_mut(node).children.insert(first.into(), leaf_id);
                return Ok(tokens.len() - pos);
            };
            let matched = self.common_pages(&self.node(child).key, &tokens[pos..]);
            let child = if matched < self.node(child).pages.len() {
                self.split(child, matched)
            } else {
                child
            };
            self.node_mut(child).last_access = now;
            pos += matched * ps;
            node = child;
        }
        Ok(0)
        // END SOLUTION
    }

    /// Keeps every node from `node` up to the root from eviction, and counts a use of each.
    pub fn lock(&mut self, node: NodeId) {
        let mut id = node;
        while id != ROOT {
            let n = self.node_mut(id);
            n.lock_ref += 1;
            n.uses += 1;
            id = n.parent;
        }
    }

    /// Undoes one [`RadixTree::lock`] of the same node.
    pub fn unlock(&mut self, node: NodeId) {
        let mut id = node;
        while id != ROOT {
            let n = self.node_mut(id);
            assert!(n.lock_ref > 0, "unlock without lock on node {id}");
            n.lock_ref -= 1;
            id = n.parent;
        }
    }

    pub fn is_locked(&self, node: NodeId) -> bool {
        self.node(node).lock_ref > 0
    }

    fn is_evictable_leaf(&self, id: NodeId) -> bool {
        let n = self.node(id);
        id != ROOT && n.children.is_empty() && n.lock_ref == 0
    }

    /// The node as an eviction candidate, if it is one: a leaf that is not locked.
    pub fn leaf_info(&self, node: NodeId) -> Option<LeafInfo> {
        let n = self.nodes.get(node)?.as_ref()?;
        self.is_evictable_leaf(node).then_some(LeafInfo {
            node,
            num_pages: n.pages.len(),
            last_access: n.last_access,
            uses: n.uses,
        })
    }

    /// Every leaf eviction may take now, in node order.
    pub fn evictable_leaves(&self) -> Vec<LeafInfo> {
        (0..self.nodes.len())
            .filter_map(|id| self.leaf_info(id))
            .collect()
    }

    /// Removes an unlocked leaf: the tree lets go of its pages. Returns how many went back to
    /// the pool (a page a running request still holds stays with it) and the leaf's parent,
    /// which may have become an evictable leaf in turn.
    pub fn remove_leaf(&mut self, pool: &mut KvPool, node: NodeId) -> (usize, NodeId) {
        assert!(
            self.leaf_info(node).is_some(),
            "node {node} is not an unlocked leaf"
        );
        // BEGIN SOLUTION
        let n = self.nodes[node].take().expect("live node");
        self.free_ids.push(node);
        let mut freed = 0;
        for &p in &n.pages {
            if pool.ref_count(p) == Ok(1) {
                freed += 1;
            }
            pool.free(p).expect("the tree holds each of its pages");
        }
        self.pages_held -= n.pages.len();
        let ps = self.page_size;
        self.node_mut(n.parent).children.remove(&n.key[..ps]);
        (freed, n.parent)
        // END SOLUTION
    }

    /// Frees least-recently-used unlocked leaves until at least `num_pages` pages went back
    /// to the pool (or nothing is evictable). A parent left childless becomes a candidate in
    /// turn. Returns (nodes evicted, pages freed).
    pub fn evict(&mut self, pool: &mut KvPool, num_pages: usize) -> (usize, usize) {
        // BEGIN SOLUTION
        let mut heap: BinaryHeap<Reverse<(u64, NodeId)>> = self
            .evictable_leaves()
            .into_iter()
            .map(|leaf| Reverse((leaf.last_access, leaf.node)))
            .collect();
        let (mut nodes, mut freed) = (0, 0);
        while freed < num_pages {
            let Some(Reverse((_, id))) = heap.pop() else {
                break;
            };
            let (pages, parent) = self.remove_leaf(pool, id);
            freed += pages;
            nodes += 1;
            if let Some(leaf) = self.leaf_info(parent) {
                heap.push(Reverse((leaf.last_access, leaf.node)));
            }
        }
        (nodes, freed)
        // END SOLUTION
    }

    /// Every cached sequence (root-to-leaf token strings), sorted: for tests and reports.
    pub fn sequences(&self) -> Vec<Vec<TokenId>> {
        let mut out = Vec::new();
        let mut stack = vec![(ROOT, Vec::new())];
        while let Some((id, prefix)) = stack.pop() {
            let n = self.node(id);
            if n.children.is_empty() && id != ROOT {
                out.push(prefix.clone());
            }
            for &c in n.children.values() {
                let mut p = prefix.clone();
                p.extend_from_slice(&self.node(c).key);
                stack.push((c, p));
            }
        }
        out.sort();
        out
    }

    fn fmt_node(&self, f: &mut fmt::Formatter<'_>, id: NodeId, indent: &str) -> fmt::Result {
        let mut children: Vec<NodeId> = self.node(id).children.values().copied().collect();
        children.sort_by(|a, b| self.node(*a).key.cmp(&self.node(*b).key));
        for (i, &c) in children.iter().enumerate() {
            let last = i + 1 == children.len();
            let n = self.node(c);
            let shown: Vec<String> = n.key.iter().take(8).map(|t| t.to_string()).collect();
            let more = if n.key.len() > 8 { " ..." } else { "" };
            let pages: Vec<String> = n.pages.iter().map(|p| p.to_string()).collect();
            let lock = if n.lock_ref > 0 {
                format!(", locked x{}", n.lock_ref)
            } else {
                String::new()
            };
            writeln!(
                f,
                "{indent}{} {} tokens [{}{more}] pages [{}]{lock}",
                if last { "└─" } else { "├─" },
                n.key.len(),
                shown.join(" "),
                pages.join(" "),
            )?;
            let deeper = format!("{indent}{}", if last { "   " } else { "│  " });
            self.fmt_node(f, c, &deeper)?;
        }
        Ok(())
    }
}

/// The tree drawn with box characters, children in token order, for people.
impl fmt::Display for RadixTree {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        writeln!(
            f,
            "radix tree: {} nodes, {} pages, page size {}",
            self.num_nodes(),
            self.pages_held,
            self.page_size
        )?;
        self.fmt_node(f, ROOT, "")
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn pool() -> KvPool {
        KvPool::new(64, 2).unwrap()
    }

    /// Allocates pages for `tokens` (whole pages) as a finished sequence would hold them.
    fn computed(pool: &mut KvPool, tokens: &[TokenId]) -> Vec<PageId> {
        pool.allocate_many(tokens.len() / 2).unwrap()
    }

    #[test]
    fn insert_then_match_shares_whole_pages() {
        let mut pool = pool();
        let mut tree = RadixTree::new(2);
        let a = [1, 2, 3, 4, 5, 6];
        let pa = computed(&mut pool, &a);
        assert_eq!(tree.insert(&mut pool, &a, &pa).unwrap(), 6);
        assert_eq!(
            pool.ref_count(pa[0]).unwrap(),
            2,
            "tree and sequence hold it"
        );

        let m = tree.match_prefix(&[1, 2, 3, 4, 5, 9, 9]);
        assert_eq!(m.num_tokens, 4, "the half-matching page is not shared");
        assert_eq!(m.pages, pa[..2]);
        assert_eq!(
            tree.num_nodes(),
            2,
            "the match split the edge after two pages"
        );
        assert_eq!(tree.match_prefix(&[7, 7]).num_tokens, 0);
        assert_eq!(tree.match_prefix(&[1]).num_tokens, 0, "less than a page");
    }

    #[test]
    fn diverging_insert_splits_and_keeps_existing_pages() {
        let mut pool = pool();
        let mut tree = RadixTree::new(2);
        let a = [1, 2, 3, 4];
        let pa = computed(&mut pool, &a);
        tree.insert(&mut pool, &a, &pa).unwrap();
        let b = [1, 2, 8, 8];
        let pb = computed(&mut pool, &b);
        assert_eq!(tree.insert(&mut pool, &b, &pb).unwrap(), 2);
        assert_eq!(
            pool.ref_count(pb[0]).unwrap(),
            1,
            "duplicate page not taken"
        );
        assert_eq!(pool.ref_count(pb[1]).unwrap(), 2);
        assert_eq!(tree.sequences(), vec![vec![1, 2, 3, 4], vec![1, 2, 8, 8]]);
        assert_eq!(tree.pages_held(), 3);
    }

    #[test]
    fn eviction_takes_lru_unlocked_leaves_and_never_locked_ones() {
        let mut pool = pool();
        let mut tree = RadixTree::new(2);
        for seq in [[1, 1, 2, 2], [1, 1, 3, 3], [4, 4, 5, 5]] {
            let pages = computed(&mut pool, &seq);
            tree.insert(&mut pool, &seq, &pages).unwrap();
            pool.free_all(&pages).unwrap(); // the sequences finished
        }
        let used = tree.match_prefix(&[1, 1, 3, 3]);
        tree.lock(used.node);
        tree.match_prefix(&[4, 4, 5, 5]); // most recent
        // [1 1 2 2]'s leaf is the oldest unlocked leaf.
        assert_eq!(tree.evict(&mut pool, 1), (1, 1));
        assert_eq!(tree.sequences(), vec![vec![1, 1, 3, 3], vec![4, 4, 5, 5]]);
        // Asking for everything frees only the unlocked branch.
        let (_, freed) = tree.evict(&mut pool, 100);
        assert_eq!(freed, 2);
        assert_eq!(tree.sequences(), vec![vec![1, 1, 3, 3]]);
        tree.unlock(used.node);
        assert_eq!(tree.evict(&mut pool, 100), (2, 2));
        assert_eq!(tree.num_nodes(), 0);
        assert_eq!(pool.num_free(), 64);
    }
}
