package broker

import (
	"context"
	"fmt"
	"sync"
)

// PerKey sends msgs for a publisher whose broker acknowledges one message at a time
// (HTTP, MQTT): the messages of one key one after another, each only after the
// previous one was acknowledged, and up to concurrency keys at once. After a failure
// the key's later messages are not sent: they get the same error if the broker is
// unavailable, else ErrHeldBack. send is called with the message's index.
func PerKey(ctx context.Context, msgs []Message, concurrency int, send func(ctx context.Context, i int) error) []Result {
	res := make([]Result, len(msgs))
	byKey := map[string][]int{}
	var keys []string
	for i := range msgs {
		k := msgs[i].Key
		if _, ok := byKey[k]; !ok {
			keys = append(keys, k)
		}
		byKey[k] = append(byKey[k], i)
	}
	if concurrency < 1 {
		concurrency = 1
	}
	sem := make(chan struct{}, concurrency)
	var wg sync.WaitGroup
	for _, k := range keys {
		wg.Add(1)
		sem <- struct{}{}
		go func(idx []int) {
			defer wg.Done()
			defer func() { <-sem }()
			var failed error
			for _, i := range idx {
				switch {
				case failed != nil && IsUnavailable(failed):
					res[i].Err = failed
				case failed != nil:
					res[i].Err = fmt.Errorf("%w (%v)", ErrHeldBack, failed)
				case ctx.Err() != nil:
					res[i].Err = ctx.Err()
				default:
					if res[i].Err = send(ctx, i); res[i].Err != nil {
						failed = res[i].Err
					}
				}
			}
		}(byKey[k])
	}
	wg.Wait()
	return res
}
