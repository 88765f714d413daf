// Package adminapi is the admin port's versioned JSON API (/api/v1/...)
// and the dashboard served over it (GET /). It reads the cluster through
// the SDK, as a client of the node it runs in, so any node answers for
// the whole cluster and each answer says which node's view it is; it
// learns the membership from the node itself (Node). The broker mounts
// it; the CLI reads the same types.
package adminapi

import (
	"encoding/json"
	"time"
)

// Member states.
const (
	StateAlive   = "alive"   // in the membership and answering
	StateSuspect = "suspect" // in the membership but not answering in time, or answering but not (yet) a member
	StateDown    = "down"    // neither a member nor answering, or refusing connections
	StateLeft    = "left"    // removed (decommissioned) by an operator
)

// Cluster is GET /api/v1/cluster.
type Cluster struct {
	ViewOf uint64 `json:"view_of"` // the node whose view this is
	Mode   string `json:"mode"`    // "single-node" or "cluster"
	// ControllerLeader is the controller group's leader as this node
	// knows it (0: none known); ControllerReachable whether that leader is
	// a live member. Without it the topics and groups may be stale: Stale
	// says so.
	ControllerLeader    uint64    `json:"controller_leader"`
	ControllerReachable bool      `json:"controller_reachable"`
	Stale               string    `json:"stale,omitempty"`
	Members             []Member  `json:"members"`
	At                  time.Time `json:"at"`
}

// Member is one node of the cluster.
type Member struct {
	NodeID         uint64     `json:"node_id"`
	Address        string     `json:"address"` // its client address
	ClusterAddress string     `json:"cluster_address,omitempty"`
	Rack           string     `json:"rack,omitempty"`
	Version        string     `json:"version,omitempty"`
	State          string     `json:"state"`
	Since          time.Time  `json:"since"`          // when the answering node saw it enter State
	Note           string     `json:"note,omitempty"` // why it is not alive: "no answer from node 3 within 800ms", ...
	StartedAt      *time.Time `json:"started_at,omitempty"`
	// Roles: "controller-leader", "controller-voter", "controller-learner".
	Roles   []string `json:"roles"`
	Leads   int      `json:"leads"`   // partitions it leads
	Follows int      `json:"follows"` // partitions it holds a replica of without leading
	Self    bool     `json:"self,omitempty"`
}

// TopicSummary is one entry of GET /api/v1/topics.
type TopicSummary struct {
	Name            string  `json:"name"`
	Partitions      int     `json:"partitions"`
	Replication     int     `json:"replication"`
	Messages        int64   `json:"messages"` // high watermark minus log start, summed
	SizeBytes       int64   `json:"size_bytes"`
	MsgsInPerSec    float64 `json:"msgs_in_per_sec"`
	BytesInPerSec   float64 `json:"bytes_in_per_sec"`
	BytesOutPerSec  float64 `json:"bytes_out_per_sec"`
	UnderReplicated int     `json:"under_replicated"`
	Offline         int     `json:"offline"`
	Internal        bool    `json:"internal,omitempty"`
}

// Topic is GET /api/v1/topics/{name}.
type Topic struct {
	TopicSummary
	Config        json.RawMessage `json:"config"` // the TopicConfig, as protojson with proto field names
	PartitionList []Partition     `json:"partition_list"`
	ViewOf        uint64          `json:"view_of"`
}

// Partition is one partition of a topic.
type Partition struct {
	ID             uint32   `json:"id"`
	Leader         uint32   `json:"leader"` // 0: none
	Replicas       []uint32 `json:"replicas"`
	TargetReplicas []uint32 `json:"target_replicas,omitempty"` // while moving
	// LiveReplicas are the replicas on nodes that are alive.
	LiveReplicas []uint32 `json:"live_replicas"`
	// InSyncReplicas are the replicas in sync with the leader, the leader
	// included (voters it heard from within an election timeout and that
	// replicate its log), as the leader reports them, less those on nodes
	// that are down (InSyncFrom "leader"; an idle group's leader keeps the
	// set it had when it went quiet); when the leader cannot be asked, the
	// live replicas ("liveness").
	InSyncReplicas []uint32 `json:"in_sync_replicas"`
	InSyncFrom     string   `json:"in_sync_from"`
	LogStart       int64    `json:"log_start"`
	HighWatermark  int64    `json:"high_watermark"`
	SizeBytes      int64    `json:"size_bytes"`
	MsgsInPerSec   float64  `json:"msgs_in_per_sec"`
	BytesInPerSec  float64  `json:"bytes_in_per_sec"`
	// BytesOutPerSec is the record bytes its leader served to fetches
	// (clients' pulls and consumer groups' reads) over the last second.
	BytesOutPerSec  float64   `json:"bytes_out_per_sec"`
	UnderReplicated bool      `json:"under_replicated"`
	Offline         bool      `json:"offline"`
	History         []float64 `json:"msgs_in_history"` // msgs/s, one sample a second, oldest first
}

// GroupSummary is one entry of GET /api/v1/groups.
type GroupSummary struct {
	Name     string `json:"name"`
	Topic    string `json:"topic"`
	Mode     string `json:"mode"`
	Members  int    `json:"members"`
	Lag      int64  `json:"lag"`
	DLQ      string `json:"dlq,omitempty"`
	DLQDepth int64  `json:"dlq_depth"`
	// Breaker: "closed", or "open"/"half_open" when any member's is.
	Breaker    string `json:"breaker"`
	LagGrowing bool   `json:"lag_growing"`
}

// Group is GET /api/v1/groups/{name}.
type Group struct {
	GroupSummary
	Info       json.RawMessage `json:"info"` // the GroupInfo, as protojson with proto field names
	LagHistory []LagSample     `json:"lag_history"`
	ViewOf     uint64          `json:"view_of"`
}

// LagSample is a group's lag at one time, in all and per partition.
type LagSample struct {
	At          time.Time        `json:"at"`
	Lag         int64            `json:"lag"`
	ByPartition map[uint32]int64 `json:"by_partition"`
}

// Scheduler is GET /api/v1/scheduler.
type Scheduler struct {
	Pending uint64 `json:"pending"` // delayed batches pending in all
	// Buckets count the listed pending batches by how far away they are
	// due: "overdue", "1m", "1h", "1d", "later". Listed: at most
	// ListedLimit of them (Listed says how many).
	Buckets map[string]int `json:"buckets"`
	Listed  int            `json:"listed"`
	// HalvesPending: transactional half messages waiting for their
	// outcome; Transactions: open transactions.
	HalvesPending int `json:"halves_pending"`
	Transactions  int `json:"transactions"`
	// Lateness: delayed batches fired in the last minute, and the p50 and
	// p99 of how late (their time to their append's commit), as bucket
	// bounds in seconds, from the scheduler's histogram (this node's, or
	// the one the scheduler's answer carried); nil when none came
	// (LatenessNote says so).
	Lateness     *Lateness `json:"lateness,omitempty"`
	LatenessNote string    `json:"lateness_note,omitempty"`
	At           time.Time `json:"at"`
}

// Lateness sums a window of the scheduler's fire lateness.
type Lateness struct {
	WindowSeconds float64 `json:"window_seconds"`
	Fired         uint64  `json:"fired"`
	P50Seconds    float64 `json:"p50_seconds"` // at most this (a bucket bound)
	P99Seconds    float64 `json:"p99_seconds"`
}

// Alert is one entry of GET /api/v1/alerts.
type Alert struct {
	Kind     string    `json:"kind"`     // node_down, node_suspect, controller_unreachable, partition_offline, under_replicated, lag_growing, breaker_open, dlq_growing
	Severity string    `json:"severity"` // "critical" or "warning"
	Subject  string    `json:"subject"`  // the node, topic/partition or group
	Message  string    `json:"message"`
	Since    time.Time `json:"since"`
}

// Alerts is GET /api/v1/alerts.
type Alerts struct {
	ViewOf uint64    `json:"view_of"`
	Alerts []Alert   `json:"alerts"`
	At     time.Time `json:"at"`
}

// Snapshot is what the dashboard's event stream sends, once a second
// while it changes: everything the views show.
type Snapshot struct {
	Cluster   Cluster    `json:"cluster"`
	Topics    []Topic    `json:"topics"`
	Groups    []Group    `json:"groups"`
	Scheduler *Scheduler `json:"scheduler,omitempty"`
	Alerts    []Alert    `json:"alerts"`
	ReadOnly  bool       `json:"read_only"`
	Errors    []string   `json:"errors,omitempty"` // what could not be read this time
	At        time.Time  `json:"at"`
}

// ErrorBody is every error answer: the protocol's typed code and a
// message.
type ErrorBody struct {
	Error struct {
		Code    string `json:"code"`
		Message string `json:"message"`
	} `json:"error"`
}
