"""Router service: query -> embedding -> SLB scan -> margin gate -> (cross-encoder) -> tool."""
