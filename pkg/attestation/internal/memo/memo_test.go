package memo

import (
	"crypto/x509"
	"sync"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
)

func TestMemoBoundedAndCleared(t *testing.T) {
	m := New[int, string](2)
	m.Put(1, "a")
	m.Put(2, "b")
	m.Put(2, "b2") // an update never clears
	v, ok := m.Get(2)
	assert.True(t, ok)
	assert.Equal(t, "b2", v)
	assert.Equal(t, 2, m.Len())

	m.Put(3, "c") // full: cleared, then stored
	assert.Equal(t, 1, m.Len())
	_, ok = m.Get(1)
	assert.False(t, ok)
	v, ok = m.Get(3)
	assert.True(t, ok)
	assert.Equal(t, "c", v)
}

func TestMemoConcurrent(t *testing.T) {
	m := New[int, int](64)
	var wg sync.WaitGroup
	for g := range 8 {
		wg.Go(func() {
			for i := range 1000 {
				m.Put(i%100, g)
				m.Get(i % 100)
			}
		})
	}
	wg.Wait()
	assert.LessOrEqual(t, m.Len(), 64)
}

func TestValidityOf(t *testing.T) {
	day := func(d int) time.Time { return time.Date(2026, 1, d, 0, 0, 0, 0, time.UTC) }
	chain := []*x509.Certificate{
		{NotBefore: day(5), NotAfter: day(20)},
		{NotBefore: day(1), NotAfter: day(15)},
		{NotBefore: day(3), NotAfter: day(28)},
	}
	nb, na := ValidityOf(chain)
	assert.Equal(t, day(5), nb)
	assert.Equal(t, day(15), na)
}
