"""One module per operation (`map`, `batch`, `shuffle`, ...), holding its MapDataset and IterDataset variants, plus the helpers only operations use."""
