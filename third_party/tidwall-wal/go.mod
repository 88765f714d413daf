module github.com/tidwall/wal

go 1.13

require (
	github.com/tidwall/gjson v1.10.2
	github.com/tidwall/tinylru v1.1.0
)
