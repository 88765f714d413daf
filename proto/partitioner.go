package heraldpb

// PartitionForKey is Herald's key partitioner, shared by the broker and the
// SDK: FNV-1a (32-bit) of the key, modulo the partition count. Records with
// the same key always land on the same partition while the count is fixed.
func PartitionForKey(key []byte, partitions uint32) uint32 {
	if partitions == 0 {
		return 0
	}
	h := uint32(2166136261)
	for _, c := range key {
		h ^= uint32(c)
		h *= 16777619
	}
	return h % partitions
}
