"""Training algorithms; ``params`` holds each one's validated parameters and the name registry."""
