module kvgate.local/hack/pause

go 1.26.0
